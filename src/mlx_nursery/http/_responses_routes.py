"""/v1/responses: create (JSON or named SSE events), retrieve, delete, input items."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attrs
from quart import Response, request

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
from ..serving import Recipe
from ..store import StoredResponse
from ._generate import generate, note_ignored, parts, respond
from ._renderers import ResponseBody, ResponseSaver, ResponseStream
from ._routes import routes
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
    prepared, job = await generate(_Response(serving.max_input_items), _note)
    saver = ResponseSaver(serving.store, prepared, owner)
    builder = ResponseBuilder(prepared)
    stream = ResponseStream(builder, saver) if prepared.prepared.stream else None
    return await respond(job, stream, ResponseBody(builder, saver))


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


def _not_found(response_id: str, param: str) -> ResourceNotFound:
    return ResourceNotFound(
        f"Response with id {quoted(response_id)} not found.", param=param, code="response_not_found"
    )
