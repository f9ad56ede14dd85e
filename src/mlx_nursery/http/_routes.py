"""The routes: check and read the body, prepare it on a worker thread (the OpenAI layer
parses, validates and tokenizes), run a job, write JSON or SSE."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import attrs
import trio
from quart import Blueprint, Response, current_app, g, request
from werkzeug.exceptions import RequestEntityTooLarge

from .. import fault_points
from ..openai import (
    Finished,
    ImageRef,
    LogprobEntry,
    ModelList,
    OpenAIError,
    Prepared,
    ReasoningDelta,
    RequestTooLarge,
    ServedModel,
    TextDelta,
    ToolCallOut,
    UnsupportedMediaType,
    chat_images,
    parse_json,
    prepare_chat,
    prepare_completion,
    quoted,
    to_json,
)
from ..serving import METRICS_CONTENT_TYPE, Job, JobItem, Service, merged_text
from ._lifetime import current_record, own
from ._pump import ended_early, pump
from ._sse import DONE, HEADERS, data_event, json_event
from ._tenancy import current_tenant

routes = Blueprint("openai", __name__)


def _service() -> Service:
    service: Service = current_app.extensions["mlx_nursery"]
    return service


@routes.get("/health")
async def health() -> Response:
    """200 `ok` only while the server takes work and every loaded model's engine runs;
    else 503 with the state (loading, draining, failed, unhealthy) and each problem: the
    model, the component, since when (RFC 3339, UTC) and what is wrong."""
    service = _service()
    problems = service.problems()
    healthy = service.state == "ready" and not problems
    body: dict[str, Any] = {"status": "ok" if healthy else _health_state(service.state)}
    if problems:
        body["problems"] = [
            {
                "model": problem.model,
                "component": problem.component,
                "since": _rfc3339(problem.since),
                "detail": problem.detail,
            }
            for problem in problems
        ]
    headers = {} if healthy or service.state == "failed" else {"Retry-After": "1"}
    return Response(
        json.dumps(body),
        status=200 if healthy else 503,
        content_type="application/json",
        headers=headers,
    )


def _health_state(state: str) -> str:
    return "unhealthy" if state == "ready" else state


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@routes.get("/metrics")
async def metrics() -> Response:
    """Prometheus text format (`_metrics.py`); open, as /health is."""
    return Response(_service().metrics.render(), content_type=METRICS_CONTENT_TYPE)


@routes.get("/v1/models")
async def list_models() -> dict[str, Any]:
    models = _service().check_open()
    return to_json(ModelList([slot.card() for slot in models.slots]))  # type: ignore[no-any-return]


@routes.get("/v1/models/<path:model>")
async def get_model(model: str) -> dict[str, Any]:
    return to_json(_service().check_open().find(model).card())  # type: ignore[no-any-return]


@routes.post("/v1/models/<path:model>/load")
async def load_model(model: str) -> dict[str, Any]:
    """Load a model now (an operator's route: admin key), unloading idle ones if it must;
    the card of the loaded model. Errors as a request for the model would get."""
    service = _service()
    models = service.check_open()
    hosted = await models.load(models.find(model), service.deadline())
    return to_json(hosted.card)  # type: ignore[no-any-return]


@routes.post("/v1/models/<path:model>/unload")
async def unload_model(model: str) -> dict[str, Any]:
    """Unload a model now (admin key); 409 while a request uses it. The model's card."""
    models = _service().check_open()
    slot = models.find(model)
    await models.unload(slot)
    return to_json(slot.card())  # type: ignore[no-any-return]


@routes.post("/v1/chat/completions")
async def chat_completions() -> Response:
    return await _complete(prepare_chat, chat_images)


@routes.post("/v1/completions")
async def completions() -> Response:
    return await _complete(prepare_completion)


IGNORED_HEADER = "x-ignored-params"
"""Names the hints a request set that this server accepted and did not act on."""


def note_ignored(prepared: Prepared, **more: str) -> None:
    """Headers about how the request was taken, added to whatever response it gets (app.py)."""
    headers: dict[str, str] = dict(more)
    if prepared.ignored:
        headers[IGNORED_HEADER] = ", ".join(prepared.ignored)
    g.response_headers = headers


async def _complete(
    prepare: Callable[[Any, ServedModel], Prepared],
    images: Callable[[Any], Iterable[ImageRef]] | None = None,
) -> Response:
    service = _service()
    models = service.check_open()
    arrived = trio.current_time()
    deadline = service.deadline()
    raw = await request_body()
    fault = service.draw_fault()
    parsed: Any = None
    if models.only is None or (
        images is not None and service.image_limits.hosts and b"http" in raw
    ):
        # Parsed first to know the model (a server of several), or to fetch remote images
        # in the request's scope before preparing; the common request skips the extra hop.
        parsed = await service.prepare(lambda: parse_json(raw), deadline)
    async with service.text_model(parsed, deadline) as (hosted, served):
        wanted = images(parsed) if images is not None and parsed is not None else ()
        async with service.fetched(served, wanted, deadline) as served:

            def work() -> Prepared:
                body = parse_json(raw) if parsed is None else parsed
                trio.from_thread.check_cancelled()
                return service.with_extra_processors(prepare(body, served), body)

            prepared = await service.prepare(work, deadline)
        note_ignored(prepared)
        job = own(
            await hosted.jobs.start(
                prepared, deadline, arrived, current_record(), fault, current_tenant().id
            )
        )  # ends with the request
    if prepared.stream:
        body = pump(job, _ChunkStream(prepared), service.writes, request_id())
        response = Response(body, content_type="text/event-stream", headers=HEADERS)
        response.timeout = None  # the job's deadline bounds the stream, not Quart's 60 s default
        return response
    return await collect(prepared, job)


def request_id() -> str:
    return str(getattr(g, "request_id", "-"))


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


Body = Callable[
    [Prepared, str, Finished, list[ToolCallOut], list[LogprobEntry], str | None], dict[str, Any]
]
"""An API's non-streaming body from a job's whole output: its text, its end, its tool calls,
its logprobs and its reasoning (None: the model did not think). Chat's, completions',
Messages'."""


def _wire_body(
    prepared: Prepared,
    text: str,
    finished: Finished,
    calls: list[ToolCallOut],
    logprobs: list[LogprobEntry],
    reasoning: str | None,
) -> dict[str, Any]:
    return prepared.body(text, finished, calls, logprobs, reasoning)


async def collect(prepared: Prepared, job: Job, body: Body = _wire_body) -> Response:
    """A non-streaming response: the job's whole output as `body` renders it. Raises the
    job's error (to the app's one handler). Cancellation: the job ends with the request."""
    pieces: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCallOut] = []
    logprobs: list[LogprobEntry] = []
    async for item in job.receive:
        if isinstance(item, TextDelta):
            pieces.append(item.text)
            logprobs.extend(item.logprobs)
        elif isinstance(item, ReasoningDelta):
            thoughts.append(item.text)
        elif isinstance(item, ToolCallOut):
            calls.append(item)
        elif isinstance(item, Finished):
            await job.settled()
            reasoning = "".join(thoughts) or None  # only a thinking model's message has one
            fault_points.reach("rendering")
            return Response(
                json.dumps(body(prepared, "".join(pieces), item, calls, logprobs, reasoning)),
                content_type="application/json",
            )
        elif isinstance(item, OpenAIError):
            raise item  # to the one handler (app.py), as every error
    raise ended_early()


@attrs.define
class _ChunkStream:
    """Chat and completions chunks, a `StreamFormat`: consecutive text in one delta."""

    prepared: Prepared
    offset: int = 0
    """Characters of content sent so far (completions' `text_offset`)."""

    def opening(self) -> bytes:
        return b"".join(data_event(chunk) for chunk in self.prepared.opening_chunks())

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        if len(items) == 1 and type(items[0]) is TextDelta:  # the usual write: one token
            return self._content(items[0]), False
        out: list[bytes] = []
        for item in merged_text(items):
            if isinstance(item, TextDelta):
                out.append(self._content(item))
            elif isinstance(item, ReasoningDelta):
                out.append(data_event(self.prepared.reasoning_chunk(item.text)))
            elif isinstance(item, ToolCallOut):
                out.extend(data_event(chunk) for chunk in self.prepared.tool_call_chunks(item))
            elif isinstance(item, Finished):
                out.extend(data_event(chunk) for chunk in self.prepared.closing_chunks(item))
                out.append(DONE)
                return b"".join(out), True
            elif isinstance(item, OpenAIError):
                out.append(self.error(item))
                return b"".join(out), True
        return b"".join(out), False

    def error(self, error: OpenAIError) -> bytes:
        return data_event(error.envelope())

    def _content(self, delta: TextDelta) -> bytes:
        start, self.offset = self.offset, self.offset + len(delta.text)
        if self.prepared.token_text is None:
            return json_event(self.prepared.delta_json(delta.text))
        return data_event(self.prepared.delta_chunk(delta.text, delta.logprobs, start))
