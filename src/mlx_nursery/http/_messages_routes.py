"""/v1/messages (JSON or Anthropic's named SSE events) and /v1/messages/count_tokens.

The same choreography as chat's (`_generate.py`): the body read and checked, parsed and
prepared on the worker thread (the Anthropic layer), a job on the model's lanes tied to the
request's lifetime, the one pump for the stream. Errors on these routes take Anthropic's
envelope (app.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from quart import Response

from ..anthropic import (
    MessageContent,
    MessageEvents,
    MessagesRequest,
    count_tokens,
    image_urls,
    parse_count_request,
    parse_messages_request,
    prepare_messages,
)
from ..generation import ImageRef, Prepared, ServedModel
from ..serving import Recipe
from ._generate import as_json, generate, parts, request_body, request_id, respond
from ._renderers import MessageStream, WholeMessage
from ._routes import routes

MESSAGES_PATH = "/v1/messages"


def is_messages_route(path: str) -> bool:
    """Whether `path` is the Messages API's (its errors take Anthropic's envelope)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


class _Message(Recipe[Prepared]):
    def parse(self, body: Any) -> MessagesRequest:
        return parse_messages_request(body)

    def images(self, request: MessagesRequest) -> Iterable[ImageRef]:
        return image_urls(request)

    def prepare(self, request: MessagesRequest, served: ServedModel) -> Prepared:
        return prepare_messages(request, served)


class _Count(Recipe[dict[str, int]]):
    def parse(self, body: Any) -> Any:
        return parse_count_request(body)

    def images(self, request: Any) -> Iterable[ImageRef]:
        return image_urls(request)

    def prepare(self, request: Any, served: ServedModel) -> dict[str, int]:
        return count_tokens(request, served)


@routes.post(MESSAGES_PATH)
async def create_message() -> Response:
    prepared, job = await generate(_Message())
    stream = MessageStream(MessageEvents(prepared), request_id()) if prepared.stream else None
    whole = WholeMessage(prepared, MessageContent(MessageEvents(prepared)))
    return await respond(job, stream, whole)


@routes.post(MESSAGES_PATH + "/count_tokens")
async def count_message_tokens() -> Response:
    """The prompt's tokens, as a message request would have them; nothing is generated."""
    serving = parts()
    serving.service.check_open()  # the 503 before the body is read
    deadline = serving.preparation.deadline()
    raw = await request_body()
    return as_json(await serving.generations.prepare(_Count(), raw, deadline))
