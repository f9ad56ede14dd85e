"""LoRA adapters through a real server: listed as models with their base as `parent`,
requested by name with the official SDK, loaded and unloaded at runtime by vLLM's admin
routes (admin key), refused while in use, and a 404 in the error envelope once gone."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from mlx_nursery.tools import make_adapter
from tests.http.test_http_metrics import weight_bytes
from tests.http_helpers import (
    engine_of,
    eventually,
    running_server,
    sdk,
    validate,
    validate_error,
)

USER, ROOT = {"Authorization": "Bearer user"}, {"Authorization": "Bearer root"}


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("http-adapters")
    return {
        "a": make_adapter(folder / "a", tiny_model, seed=3, rank=4),
        "b": make_adapter(folder / "b", tiny_model, seed=4, rank=8, keys=("v_proj", "o_proj")),
    }


async def _text(client: openai.AsyncOpenAI, model: str) -> str:
    completion = await client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, temperature=0
    )
    return completion.choices[0].text


async def test_adapters_are_models_of_their_base_and_load_and_unload_at_runtime(
    tiny_model: Path, adapter_dirs: dict[str, Path]
) -> None:
    async with (
        running_server(
            tiny_model,
            lora=(f"a={adapter_dirs['a']}",),
            api_key="user",
            admin_key="root",
            skip_warmup=True,
        ) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60, headers=USER) as http,
    ):
        client = sdk(server, api_key="user")
        listing = (await http.get("/v1/models")).json()["data"]
        for card in listing:
            validate(card, "Model")
        cards = {card["id"]: card for card in listing}
        assert cards["a"]["parent"] == cards["a"]["root"] == "tiny"
        assert "parent" not in cards["tiny"]
        assert (await http.get("/v1/models/a")).json()["parent"] == "tiny"
        base, adapted = await _text(client, "tiny"), await _text(client, "a")
        assert adapted != base
        chat = {"max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
        replies = {}
        for model in ("tiny", "a"):
            reply = await http.post("/v1/messages", json={**chat, "model": model})
            assert reply.status_code == 200 and reply.json()["model"] == model
            replies[model] = reply.json()["content"]
        assert replies["a"] != replies["tiny"]  # Anthropic's API runs the adapter too

        missing = await http.post(
            "/v1/chat/completions",
            json={"model": "b", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert missing.status_code == 404
        validate_error(missing.json())
        assert missing.json()["error"]["code"] == "model_not_found"

        load = {"lora_name": "b", "lora_path": str(adapter_dirs["b"])}
        refused = await http.post("/v1/load_lora_adapter", json=load)
        assert refused.status_code == 403
        assert (await http.post("/v1/load_lora_adapter", json=load, headers=ROOT)).is_success
        assert (await http.get("/v1/models/b")).json()["parent"] == "tiny"
        other = await _text(client, "b")
        assert other not in (base, adapted)
        assert await _text(client, "a") == adapted  # the batch's slots moved nothing
        metrics = (await http.get("/metrics")).text
        reserved = [
            line
            for line in metrics.splitlines()
            if line.startswith("mlx_nursery:model_reserved_bytes") and 'part="adapters"' in line
        ]
        assert len(reserved) == 1 and float(reserved[0].rsplit(" ", 1)[1]) > 0

        body = {
            "model": "b",
            "prompt": "Once",
            "max_tokens": 3000,
            "temperature": 0,
            "stream": True,
        }
        async with http.stream("POST", "/v1/completions", json=body) as stream:
            async for _ in stream.aiter_lines():
                break  # it runs: its adapter is in use
            busy = await http.post("/v1/unload_lora_adapter", json={"lora_name": "b"}, headers=ROOT)
            assert busy.status_code == 409
            assert busy.json()["error"]["code"] == "adapter_busy"
        engine = engine_of(server)  # the stream's end reaches the engine after the client's
        await eventually(lambda: not engine.adapters_in_use, "the stream of b ended")
        unloaded = await http.post("/v1/unload_lora_adapter", json={"lora_name": "b"}, headers=ROOT)
        assert unloaded.is_success
        with pytest.raises(openai.NotFoundError):
            await _text(client, "b")
        again = await http.post("/v1/unload_lora_adapter", json={"lora_name": "b"}, headers=ROOT)
        assert again.status_code == 404
        validate_error(again.json())
        assert "b" not in {c["id"] for c in (await http.get("/v1/models")).json()["data"]}


async def test_an_adapter_past_the_memory_budget_is_a_503_and_not_served(
    tiny_model: Path, adapter_dirs: dict[str, Path]
) -> None:
    """A budget that holds the base (weights and KV) with less room left than the adapter's
    file: its load is refused with 503 `insufficient_memory` before the engine reads it, no
    model of its name appears, and the base serves as before."""
    kv = 1 << 20
    adapter = (adapter_dirs["b"] / "adapters.safetensors").stat().st_size
    async with (
        running_server(
            tiny_model,
            enable_lora=True,
            memory_budget=weight_bytes(tiny_model) + kv + adapter // 2,
            kv_cache_bytes=kv,
            prompt_cache_bytes=0,
            skip_warmup=True,
        ) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        load = {"lora_name": "b", "lora_path": str(adapter_dirs["b"])}
        refused = await http.post("/v1/load_lora_adapter", json=load)
        assert refused.status_code == 503, refused.text
        validate_error(refused.json())
        error = refused.json()["error"]
        assert error["code"] == "insufficient_memory" and "'b'" in error["message"]
        assert engine_of(server).adapters == {}
        assert "b" not in {c["id"] for c in (await http.get("/v1/models")).json()["data"]}
        with pytest.raises(openai.NotFoundError):
            await _text(sdk(server), "b")
        assert await _text(sdk(server), "tiny")
