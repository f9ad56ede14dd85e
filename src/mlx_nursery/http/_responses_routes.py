"""/v1/responses: create (JSON or named SSE events; in the background too), retrieve (a
background stream resumed after any event), cancel, delete, input items."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any

import attrs
from quart import Response, g, request

from ..generation import (
    ImageRef,
    InvalidRequest,
    Prepared,
    ResourceNotFound,
    ServedModel,
    quoted,
    responses_images,
)
from ..openai import (
    PreparedResponse,
    ResponseBuilder,
    ResponsesRequest,
    input_items_page,
    parse_responses_request,
    prepare_response,
)
from ..serving import BackgroundLaunch, Recipe
from ..store import StoredResponse
from ._generate import IGNORED_HEADER, as_json, generate_or_detach, note_ignored, parts, respond
from ._renderers import ResponseBody, ResponseSaver, ResponseStream
from ._routes import routes
from ._sse import HEADERS, named_events
from ._tenancy import current_tenant

TRUNCATED_HEADER = "x-truncated-messages"
"""How many of the oldest messages `truncation: "auto"` left out of the prompt."""


@attrs.define
class _Response(Recipe[PreparedResponse]):
    """A Responses request; its previous response (if it names one) loaded before the model
    is leased."""

    max_items: int
    previous: list[Any] | None = None

    def parse(self, body: Any) -> ResponsesRequest:
        return parse_responses_request(body, max_items=self.max_items)

    async def resolve(self, request: ResponsesRequest) -> None:
        if request.previous_response_id:
            stored = await _stored(request.previous_response_id, "previous_response_id")
            self.previous = stored.conversation

    def images(self, request: ResponsesRequest) -> Iterable[ImageRef]:
        return responses_images(request.input, self.previous)

    def prepare(self, request: ResponsesRequest, served: ServedModel) -> PreparedResponse:
        return prepare_response(request, served, self.previous)

    def plan(self, prepared: PreparedResponse) -> Prepared:
        return prepared.prepared

    def with_plan(self, prepared: PreparedResponse, plan: Prepared) -> PreparedResponse:
        return attrs.evolve(prepared, prepared=plan)


def _note(prepared: PreparedResponse) -> None:
    truncated = prepared.truncated_messages
    note_ignored(prepared.prepared, **({TRUNCATED_HEADER: str(truncated)} if truncated else {}))


@routes.post("/v1/responses")
async def create_response() -> Response:
    serving = parts()
    owner = current_tenant().id  # read here: a stream's body runs outside the request
    launch = BackgroundLaunch(serving.background, owner)
    prepared, job = await generate_or_detach(_Response(serving.max_input_items), launch, _note)
    if job is None:  # in the background: answered at once, queued
        if prepared.prepared.stream:
            return _event_stream(serving.background.events(prepared.id, -1))
        return as_json(launch.body)
    saver = ResponseSaver(serving.store, prepared, owner)
    builder = ResponseBuilder(prepared)
    stream = ResponseStream(builder, saver) if prepared.prepared.stream else None
    return await respond(job, stream, ResponseBody(builder, saver))


@routes.get("/v1/responses/<response_id>")
async def retrieve_response(response_id: str) -> Response:
    streamed = _flag("stream")
    after = _starting_after() if streamed else -1
    if _flag("include_obfuscation"):
        g.response_headers = {IGNORED_HEADER: "include_obfuscation"}  # no obfuscation is sent
    stored = await parts().background.current(await _stored(response_id))
    if not streamed:
        return as_json(stored.body)
    if stored.body.get("background") is not True:
        raise InvalidRequest(
            "This response cannot be streamed because it was not created with background=true.",
            param="stream",
        )
    serving = parts()
    first = await serving.store.events(response_id, after)
    if not first and not await serving.store.events(response_id, -1):
        raise InvalidRequest(
            "This response cannot be streamed because it was not created with stream=true.",
            param="stream",
        )
    last = int(first[-1]["sequence_number"]) if first else after

    async def resumed() -> AsyncGenerator[list[dict[str, Any]]]:
        if first:
            yield first
        async with aclosing(serving.background.events(response_id, last)) as rest:
            async for events in rest:
                yield events

    return _event_stream(resumed())


@routes.post("/v1/responses/<response_id>/cancel")
async def cancel_response(response_id: str) -> Response:
    stored = await _stored(response_id)
    return as_json(await parts().background.cancel(stored))


@routes.delete("/v1/responses/<response_id>")
async def delete_response(response_id: str) -> Response:
    stored = await _stored(response_id)  # the owner's (or an admin's) to delete
    stored = await parts().background.current(stored)
    if stored.runner is not None:
        raise InvalidRequest(
            "Cannot delete an in-flight response: cancel it first, or wait for it to end.",
            param="response_id",
        )
    if not await parts().store.delete(response_id):
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
    stored = await parts().store.get(response_id)
    if stored is None or not current_tenant().owns(stored.owner):
        raise _not_found(response_id, param)
    return stored


def _event_stream(batches: AsyncGenerator[list[dict[str, Any]]]) -> Response:
    """A background response's events as named SSE events, each batch one write. The
    client leaving ends the stream (and closes `batches`), never the response."""

    async def body() -> AsyncIterator[bytes]:
        async with aclosing(batches):
            async for events in batches:
                yield named_events(events)

    response = Response(body(), content_type="text/event-stream", headers=HEADERS)
    response.timeout = None  # the response's own deadline bounds it
    return response


def _flag(name: str) -> bool:
    """A boolean query parameter (`true` / `false`, as the SDKs send them)."""
    value = request.args.get(name, "false").lower()
    if value not in ("true", "false"):
        raise InvalidRequest(
            f"{name} must be true or false, got {quoted(value)}", param=name, code="invalid_value"
        )
    return value == "true"


def _starting_after() -> int:
    given = request.args.get("starting_after", "-1")
    try:
        after = int(given)
    except ValueError:
        after = -2
    if after < -1:
        raise InvalidRequest(
            f"starting_after must be a sequence number (an integer, at least -1), got"
            f" {quoted(given)}",
            param="starting_after",
            code="invalid_value",
        )
    return after


def _not_found(response_id: str, param: str) -> ResourceNotFound:
    return ResourceNotFound(
        f"Response with id {quoted(response_id)} not found.", param=param, code="response_not_found"
    )
