"""The routes: /health, /metrics, the model routes, cancelling a request by its id, and chat
and completions, thin adapters over the generation choreography (`_generate.py`): what to
prepare, which renderer."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import attrs
from quart import Blueprint, Response

from ..generation import (
    ImageRef,
    InvalidRequest,
    ModelList,
    Prepared,
    ResourceNotFound,
    ServedModel,
    chat_images,
    quoted,
    to_json,
)
from ..openai import prepare_chat, prepare_completion
from ..serving import METRICS_CONTENT_TYPE, Recipe
from ._generate import generate, parts, request_body, respond
from ._renderers import ChunkStream, WholeBody
from ._tenancy import current_tenant

routes = Blueprint("openai", __name__)


@routes.get("/health")
async def health() -> Response:
    """200 `ok` only while the server takes work and every loaded model's engine runs;
    else 503 with the state (loading, draining, failed, unhealthy) and each problem: the
    model, the component, since when (RFC 3339, UTC) and what is wrong."""
    service = parts().service
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
    return Response(parts().metrics.render(), content_type=METRICS_CONTENT_TYPE)


@routes.get("/v1/models")
async def list_models() -> dict[str, Any]:
    service = parts().service
    models = service.listing()
    cards = [slot.card() for slot in models.slots]
    if models.only is not None:  # LoRA adapters, on a server's one model
        cards += service.adapters.cards(models.only)
    return to_json(ModelList(cards))  # type: ignore[no-any-return]


@routes.get("/v1/models/<path:model>")
async def get_model(model: str) -> dict[str, Any]:
    service = parts().service
    models = service.listing()
    only = models.only
    if only is not None and model in service.adapters.paths:
        (card,) = [c for c in service.adapters.cards(only) if c.id == model]
        return to_json(card)  # type: ignore[no-any-return]
    return to_json(models.find(model).card())  # type: ignore[no-any-return]


@routes.post("/v1/models/<path:model>/load")
async def load_model(model: str) -> dict[str, Any]:
    """Load a model now (an operator's route: admin key), unloading idle ones if it must;
    the card of the loaded model. Errors as a request for the model would get."""
    serving = parts()
    models = serving.service.check_open()
    hosted = await models.load(models.find(model), serving.preparation.deadline())
    return to_json(hosted.card)  # type: ignore[no-any-return]


@routes.post("/v1/models/<path:model>/unload")
async def unload_model(model: str) -> dict[str, Any]:
    """Unload a model now (admin key); 409 while a request uses it. The model's card."""
    models = parts().service.check_open()
    slot = models.find(model)
    await models.unload(slot)
    return to_json(slot.card())  # type: ignore[no-any-return]


@routes.post("/v1/requests/<request_id>/cancel")
async def cancel_request(request_id: str) -> dict[str, Any]:
    """Stop a running request of the caller's key (an admin key: anyone's) by its
    `x-request-id`: its compute stops within an engine step, and it ends with a 409
    `request_cancelled`. 404 for an id that runs nothing of the key's (docs/decisions/0041)."""
    if (await request_body()).strip() not in (b"", b"{}"):
        raise InvalidRequest("this route takes no body", code="invalid_value")
    if not parts().live.cancel(current_tenant(), request_id):
        raise ResourceNotFound(
            f"No running request with id {quoted(request_id)}.",
            param="request_id",
            code="request_not_found",
        )
    return {"id": request_id, "object": "request", "cancelled": True}


@attrs.frozen
class _Completion(Recipe[Prepared]):
    """Chat's or completions' request: its body is the request, read lazily."""

    prepare_body: Callable[[Any, ServedModel], Prepared]
    take_images: Callable[[Any], Iterable[ImageRef]] | None = None
    names_images: bool = False
    lazy: bool = True

    def images(self, request: Any) -> Iterable[ImageRef]:
        return self.take_images(request) if self.take_images is not None else ()

    def prepare(self, request: Any, served: ServedModel) -> Prepared:
        return self.prepare_body(request, served)


@routes.post("/v1/chat/completions")
async def chat_completions() -> Response:
    prepared, job = await generate(_Completion(prepare_chat, chat_images, names_images=True))
    stream = ChunkStream(prepared) if prepared.stream else None
    return await respond(job, stream, WholeBody(prepared))


@routes.post("/v1/completions")
async def completions() -> Response:
    prepared, job = await generate(_Completion(prepare_completion))
    stream = ChunkStream(prepared) if prepared.stream else None
    return await respond(job, stream, WholeBody(prepared))
