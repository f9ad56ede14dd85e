"""The HTTP side of the generation choreography (serving/_generations.py): the request's
parts, body and identity handed to it, the job's output written as SSE or one JSON body.
The text routes are thin adapters over `generate` and `respond`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import trio
from quart import Response, current_app, g, request
from werkzeug.exceptions import RequestEntityTooLarge

from ..generation import Prepared, RequestTooLarge, UnsupportedMediaType, quoted
from ..serving import (
    BodyRenderer,
    Caller,
    Detach,
    Job,
    LiveRequest,
    Parts,
    Recipe,
    RenderedStream,
    StreamRenderer,
    collect,
)
from ._lifetime import current_record, live_request, own
from ._pump import pump
from ._sse import HEADERS
from ._tenancy import current_tenant

R = TypeVar("R")

IGNORED_HEADER = "x-ignored-params"
"""Names the hints a request set that this server accepted and did not act on."""


def parts() -> Parts:
    """The parts the app serves with (app.py builds them)."""
    found: Parts = current_app.extensions["mlx_nursery"]
    return found


async def generate(recipe: Recipe[R], note: Callable[[R], None] | None = None) -> tuple[R, Job]:
    """The request's body read and prepared as `recipe` says, its job started and tied to
    the request (it ends with it). `note` adds headers about how the request was taken
    (default: `note_ignored`). Raises the API's errors, to the app's one handler."""
    caller = await _caller(recipe, note)
    return await parts().generations.start(recipe, caller)


async def generate_or_detach(
    recipe: Recipe[R], detach: Detach[R], note: Callable[[R], None] | None = None
) -> tuple[R, Job | None]:
    """As `generate`; but a request `detach` wants is launched by it, apart from the
    request (no job is returned: None)."""
    caller = await _caller(recipe, note)
    return await parts().generations.start_or_detach(recipe, caller, detach)


async def _caller(recipe: Recipe[R], note: Callable[[R], None] | None) -> Caller:
    """The request as the choreography knows it, its body read."""
    serving = parts()
    serving.service.check_open()  # the 503 before the body is read
    arrived = trio.current_time()
    deadline = serving.preparation.deadline()
    live = current_live()  # a cancel by its id while the body arrives stops it once read
    raw = await request_body()
    return Caller(
        raw=raw,
        arrived=arrived,
        deadline=deadline,
        record=current_record(),
        tenant=current_tenant().id,
        note=note or (lambda prepared: note_ignored(recipe.plan(prepared))),
        own=own,
        live=live,
    )


async def respond(job: Job, stream: StreamRenderer | None, body: BodyRenderer) -> Response:
    """The job's output: an SSE stream as `stream` renders it, else (None) one JSON body."""
    if stream is not None:
        events = pump(job, RenderedStream(stream), parts().writes, request_id())
        response = Response(events, content_type="text/event-stream", headers=HEADERS)
        response.timeout = None  # the job's deadline bounds the stream, not Quart's 60 s default
        return response
    return Response(json.dumps(await collect(job, body)), content_type="application/json")


def note_ignored(prepared: Prepared, **more: str) -> None:
    """Headers about how the request was taken, added to whatever response it gets (app.py)."""
    headers: dict[str, str] = dict(more)
    if prepared.ignored:
        headers[IGNORED_HEADER] = ", ".join(prepared.ignored)
    g.response_headers = headers


def request_id() -> str:
    return str(getattr(g, "request_id", "-"))


def current_live() -> LiveRequest:
    """The current request's entry among those a client may cancel by its id
    (`POST /v1/requests/{id}/cancel`)."""
    return live_request(current_tenant().id, request_id())


async def request_body() -> bytes:
    """The raw body, after the checks that need no parsing.

    415 for a Content-Type other than JSON (`application/json`, any parameters, a charset
    only UTF-8); no Content-Type at all is read as JSON, the only thing these routes take
    (some clients send raw bytes without one). 413 past `--max-request-bytes`: at once when
    Content-Length says so, else as soon as a chunked body passes it (Quart's
    MAX_CONTENT_LENGTH counts as it reads).
    """
    try:
        # Read before refusing a Content-Type: a body left unread makes the server drop the
        # connection, and a client reusing it (keep-alive) then sees no response at all.
        data = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    except RequestEntityTooLarge:
        limit = current_app.config["MAX_CONTENT_LENGTH"]
        raise RequestTooLarge(
            f"the request body is larger than {limit} bytes, this server's limit "
            "(--max-request-bytes)",
            code="request_too_large",
        ) from None
    if "Content-Type" in request.headers:
        charset = request.mimetype_params.get("charset", "utf-8").lower()
        if request.mimetype != "application/json" or charset not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(
                "the request body must be JSON (Content-Type: application/json), got "
                f"{quoted(request.headers['Content-Type'])}",
                code="unsupported_media_type",
            )
    return data


def as_json(value: Any) -> Response:
    return Response(json.dumps(value), content_type="application/json")
