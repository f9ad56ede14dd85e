"""/v1/messages (JSON or Anthropic's named SSE events) and /v1/messages/count_tokens.

The same path as chat's: the body read and checked, parsed and prepared on the worker
thread (the Anthropic layer), a job on the model's lanes tied to the request's lifetime,
the one pump for the stream. Errors on these routes take Anthropic's envelope (app.py).
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio
from quart import Response

from ..anthropic import (
    MessageEvents,
    MessagesRequest,
    count_tokens,
    image_urls,
    message_body,
    parse_count_request,
    parse_messages_request,
    prepare_messages,
)
from ..anthropic import error_body as anthropic_error
from ..openai import (
    Admitted,
    Finished,
    OpenAIError,
    Prepared,
    ReasoningDelta,
    TextDelta,
    ToolCallOut,
    parse_json,
)
from ..serving import JobItem, merged_text
from ._lifetime import current_record, own
from ._pump import pump
from ._routes import _service, collect, note_ignored, request_body, request_id, routes
from ._sse import HEADERS, named_events
from ._tenancy import current_tenant

MESSAGES_PATH = "/v1/messages"


def is_messages_route(path: str) -> bool:
    """Whether `path` is the Messages API's (its errors take Anthropic's envelope)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


@routes.post(MESSAGES_PATH)
async def create_message() -> Response:
    service = _service()
    service.check_open()  # the 503 before the body is read
    arrived = trio.current_time()
    deadline = service.deadline()
    raw = await request_body()
    fault = service.draw_fault()

    def parse() -> tuple[Any, MessagesRequest]:
        body = parse_json(raw)
        return body, parse_messages_request(body)

    body, parsed = await service.prepare(parse, deadline)
    async with service.text_model(body, deadline) as (hosted, served):
        async with service.fetched(served, image_urls(parsed), deadline) as served:

            def prepare() -> Prepared:
                return service.with_extra_processors(prepare_messages(parsed, served), body)

            prepared = await service.prepare(prepare, deadline)
        note_ignored(prepared)
        job = own(
            await hosted.jobs.start(
                prepared, deadline, arrived, current_record(), fault, current_tenant().id
            )
        )  # ends with the request
    if prepared.stream:
        stream = _MessageStream(MessageEvents(prepared), request_id())
        response = Response(
            pump(job, stream, service.writes, stream.request_id),
            content_type="text/event-stream",
            headers=HEADERS,
        )
        response.timeout = None  # the job's deadline bounds the stream
        return response
    return await collect(prepared, job, message_body)


@routes.post(MESSAGES_PATH + "/count_tokens")
async def count_message_tokens() -> Response:
    """The prompt's tokens, as a message request would have them; nothing is generated."""
    service = _service()
    service.check_open()  # the 503 before the body is read
    deadline = service.deadline()
    raw = await request_body()

    def parse() -> tuple[Any, Any]:
        body = parse_json(raw)
        return body, parse_count_request(body)

    body, parsed = await service.prepare(parse, deadline)
    async with (
        service.text_model(body, deadline) as (_, leased),
        service.fetched(leased, image_urls(parsed), deadline) as served,
    ):
        counted = await service.prepare(lambda: count_tokens(parsed, served), deadline)
    return Response(json.dumps(counted), content_type="application/json")


@attrs.define
class _MessageStream:
    """A message's named SSE events, a `StreamFormat`: consecutive text in one delta."""

    events: MessageEvents
    request_id: str
    """Read in the handler: the body runs outside the request's context."""

    def opening(self) -> bytes:
        return b""  # message_start waits for the admission, which says the prompt's usage

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        out: list[dict[str, Any]] = []
        for item in merged_text(items):
            if isinstance(item, Admitted):
                out += self.events.opening(item)
            elif isinstance(item, TextDelta):
                out += self.events.text(item)
            elif isinstance(item, ReasoningDelta):
                out += self.events.thinking(item)
            elif isinstance(item, ToolCallOut):
                out += self.events.call(item)
            elif isinstance(item, Finished):
                out += self.events.finish(item)
                return named_events(out), True
            elif isinstance(item, OpenAIError):
                return named_events(out) + self.error(item), True
        return named_events(out), False

    def error(self, error: OpenAIError) -> bytes:
        return named_events([anthropic_error(error, self.request_id)])
