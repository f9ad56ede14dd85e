"""vLLM's LoRA admin routes: `POST /v1/load_lora_adapter {lora_name, lora_path}` and
`POST /v1/unload_lora_adapter {lora_name}` (admin key where keys are on: `_access.py`).
What they do is the serving core's (serving/_adapters.py); the adapter then serves as the
model `lora_name` in every generation API."""

from __future__ import annotations

import json
from pathlib import Path

from quart import Response

from ..generation import InvalidRequest, quoted
from ._generate import as_json, parts, request_body
from ._routes import routes


@routes.post("/v1/load_lora_adapter")
async def load_lora_adapter() -> Response:
    """Load an adapter on the server's one model (loading the model first if it must) and
    serve it as `lora_name` (`Service.load_adapter`)."""
    body = await _body(("lora_name", "lora_path"))
    name, path = body["lora_name"], Path(body["lora_path"])
    serving = parts()
    await serving.service.load_adapter(name, path, serving.preparation.deadline())
    return as_json({"object": "lora_adapter", "lora_name": name, "loaded": True})


@routes.post("/v1/unload_lora_adapter")
async def unload_lora_adapter() -> Response:
    """Stop serving an adapter (404 for one not served; 409 while a request of it runs)."""
    name = (await _body(("lora_name",)))["lora_name"]
    await parts().service.unload_adapter(name)
    return as_json({"object": "lora_adapter", "lora_name": name, "loaded": False})


async def _body(fields: tuple[str, ...]) -> dict[str, str]:
    """The body's string `fields`, each required (400 naming the first missing)."""
    try:
        body = json.loads(await request_body() or b"{}")
    except ValueError:
        raise InvalidRequest("the body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", code="invalid_type")
    for field in fields:
        value = body.get(field)
        if not isinstance(value, str) or not value:
            raise InvalidRequest(
                f"Missing required parameter: {quoted(field)}.",
                param=field,
                code="missing_required_parameter",
            )
    return {field: body[field] for field in fields}
