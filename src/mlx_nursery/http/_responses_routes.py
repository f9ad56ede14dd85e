"""/v1/responses: create (JSON or named SSE events), retrieve, delete, input items."""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
import trio
from quart import Response, request

from .. import fault_points
from ..openai import (
    Finished,
    InvalidRequest,
    OpenAIError,
    PreparedResponse,
    ReasoningDelta,
    ResourceNotFound,
    ResponseBuilder,
    ResponsesRequest,
    TextDelta,
    ToolCallOut,
    input_items_page,
    parse_json,
    parse_responses_request,
    prepare_response,
    quoted,
    responses_images,
)
from ..serving import JobItem, Service, merged_text
from ..store import StoredResponse
from ._lifetime import current_record, own
from ._pump import ended_early, pump
from ._routes import _service, note_ignored, request_body, request_id, routes
from ._sse import HEADERS, named_events
from ._tenancy import current_tenant

TRUNCATED_HEADER = "x-truncated-messages"
"""How many of the oldest messages `truncation: "auto"` left out of the prompt."""


@routes.post("/v1/responses")
async def create_response() -> Response:
    service = _service()
    service.check_open()  # the 503 before the body is read
    arrived = trio.current_time()
    deadline = service.deadline()
    raw = await request_body()
    fault = service.draw_fault()

    def parse() -> tuple[Any, ResponsesRequest]:
        body = parse_json(raw)
        return body, parse_responses_request(body, max_items=service.settings.max_messages)

    body, parsed = await service.prepare(parse, deadline)
    owner = current_tenant().id  # read here: a stream's body runs outside the request
    previous = None
    if parsed.previous_response_id:
        previous = (await _stored(parsed.previous_response_id, "previous_response_id")).conversation
    async with service.text_model(body, deadline) as (hosted, served):
        images = responses_images(parsed.input, previous)
        async with service.fetched(served, images, deadline) as served:

            def prepare() -> PreparedResponse:
                prepared = prepare_response(parsed, served, previous)
                return attrs.evolve(
                    prepared, prepared=service.with_extra_processors(prepared.prepared, body)
                )

            prepared = await service.prepare(prepare, deadline)
        truncated = (
            {TRUNCATED_HEADER: str(prepared.truncated_messages)}
            if prepared.truncated_messages
            else {}
        )
        note_ignored(prepared.prepared, **truncated)
        job = own(
            await hosted.jobs.start(
                prepared.prepared,
                deadline,
                arrived,
                current_record(),
                fault,
                current_tenant().id,
            )
        )  # request's
    builder = ResponseBuilder(prepared)
    if parsed.stream:
        events = _EventStream(service, prepared, builder, owner)
        response = Response(
            pump(job, events, service.writes, request_id()),
            content_type="text/event-stream",
            headers=HEADERS,
        )
        response.timeout = None
        return response
    async for item in job.receive:
        if isinstance(item, OpenAIError):
            raise item  # to the one handler (app.py), as every error
        fault_points.reach("rendering")
        _apply(builder, item)
        if isinstance(item, Finished):
            await _save(service, prepared, builder, owner)
            await job.settled()
            return Response(json.dumps(builder.response()), content_type="application/json")
    raise ended_early()


def _apply(builder: ResponseBuilder, item: Any) -> list[dict[str, Any]]:
    if isinstance(item, TextDelta):
        return builder.text(item.text, item.logprobs)
    if isinstance(item, ReasoningDelta):
        return builder.reasoning(item.text)
    if isinstance(item, ToolCallOut):
        return builder.call(item)
    return builder.finish(item)


@attrs.define
class _EventStream:
    """The named SSE events of one response, a `StreamFormat`. The response is stored before
    its final event goes out, so a client can always retrieve what it was told is done."""

    service: Service
    prepared: PreparedResponse
    builder: ResponseBuilder
    owner: str | None
    """The tenant that will own the stored response."""

    def opening(self) -> bytes:
        return named_events(self.builder.opening())

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        events: list[dict[str, Any]] = []
        for item in merged_text(items):
            if isinstance(item, OpenAIError):
                events.append(self.builder.error_event(item))
                return named_events(events), True
            events += _apply(self.builder, item)
            if isinstance(item, Finished):
                await _save(self.service, self.prepared, self.builder, self.owner)
                events.append(self.builder.final_event())
                return named_events(events), True
        return named_events(events), False

    def error(self, error: OpenAIError) -> bytes:
        return named_events([self.builder.error_event(error)])


async def _save(
    service: Service, prepared: PreparedResponse, builder: ResponseBuilder, owner: str | None
) -> None:
    if prepared.store:
        await service.store.put(
            StoredResponse(
                prepared.id,
                time.time(),  # the store's order: the response's created_at has whole seconds
                builder.response(),
                prepared.input_items,
                builder.conversation(),
                owner,
            )
        )


@routes.get("/v1/responses/<response_id>")
async def retrieve_response(response_id: str) -> Response:
    if request.args.get("stream", "false").lower() == "true":
        raise InvalidRequest(
            "streaming a stored response is not supported",
            param="stream",
            code="unsupported_parameter",
        )
    stored = await _stored(response_id)
    return Response(json.dumps(stored.body), content_type="application/json")


@routes.delete("/v1/responses/<response_id>")
async def delete_response(response_id: str) -> Response:
    await _stored(response_id)  # the owner's (or an admin's) to delete
    if not await _service().store.delete(response_id):
        raise _not_found(response_id, "response_id")
    body = {"id": response_id, "object": "response", "deleted": True}
    return Response(json.dumps(body), content_type="application/json")


@routes.get("/v1/responses/<response_id>/input_items")
async def list_input_items(response_id: str) -> Response:
    stored = await _stored(response_id)
    try:
        limit = int(request.args.get("limit", "20"))
    except ValueError:
        raise InvalidRequest(
            "limit must be an integer", param="limit", code="invalid_value"
        ) from None
    if request.args.getlist("include"):
        raise InvalidRequest(
            "'include' is not supported", param="include", code="unsupported_parameter"
        )
    page = input_items_page(
        stored.input_items,
        after=request.args.get("after"),
        limit=limit,
        order=request.args.get("order", "desc"),
    )
    return Response(json.dumps(page), content_type="application/json")


async def _stored(response_id: str, param: str = "response_id") -> StoredResponse:
    """The stored response if the request's tenant owns it (or is an admin). Another key's
    is not found, exactly as one that never existed: its existence is not told."""
    stored = await _service().store.get(response_id)
    if stored is None or not current_tenant().owns(stored.owner):
        raise _not_found(response_id, param)
    return stored


def _not_found(response_id: str, param: str) -> ResourceNotFound:
    return ResourceNotFound(
        f"Response with id {quoted(response_id)} not found.", param=param, code="response_not_found"
    )
