"""Several models on one real server: loaded on demand, evicted when idle and never while in
use, within a count and a memory budget; operators' load and unload routes behind admin keys;
memory back after an unload, by MLX's own counter."""

from __future__ import annotations

import json
import socket
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest
import trio

from mlx_nursery.server import serve
from mlx_nursery.serving import model_sources
from mlx_nursery.serving._registry import ModelRegistry
from mlx_nursery.settings import Settings, SettingsError
from tests.http.test_http_metrics import samples, value
from tests.http_helpers import (
    chat_body,
    eventually,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
    validate,
    validate_error,
)

LONG = 3000  # the tiny model never emits EOS at temperature 0: a stream that runs until stopped


def weight_bytes(model: Path) -> int:
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))


def two_models(model: Path, **settings: Any) -> Any:
    """A server of the tiny model under two names (`a`, `b`): two slots, two engines."""
    return running_server(
        None,
        model=(f"{model}=a", f"{model}=b"),
        request_timeout=60,
        **settings,
    )


async def models_by_id(http: httpx.AsyncClient) -> dict[str, Any]:
    listing = (await http.get("/v1/models")).json()
    for card in listing["data"]:
        validate(card, "Model")
    return {card["id"]: card for card in listing["data"]}


async def loaded_models(http: httpx.AsyncClient) -> dict[str, bool]:
    return {name: card["loaded"] for name, card in (await models_by_id(http)).items()}


async def chat(http: httpx.AsyncClient, model: str, **fields: Any) -> httpx.Response:
    return await http.post(
        "/v1/chat/completions",
        json={**chat_body(max_tokens=3, temperature=0), "model": model, **fields},
    )


async def test_the_models_are_listed_while_they_load(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A UI that lists the models at its own start sees them (not loaded yet) while the server
    loads; /health and the generation routes still say it is loading."""
    gate = trio.Event()
    original = ModelRegistry.load

    async def held(self: ModelRegistry, slot: Any, deadline: float) -> Any:
        await gate.wait()
        return await original(self, slot, deadline)

    monkeypatch.setattr(ModelRegistry, "load", held)
    with socket.socket() as probe:  # a free port: `serve` reports its URL only once ready
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = Settings(
        model=str(tiny_model),
        served_model_name="tiny",
        port=port,
        responses_db=":memory:",
        warmup_budget=0.0,
        shutdown_grace=5.0,
    )
    shutdown = trio.Event()
    async with (
        trio.open_nursery() as nursery,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
    ):
        nursery.start_soon(partial(serve, settings, shutdown=shutdown, handle_signals=False))
        health = None
        with trio.fail_after(60):
            while health is None:  # the server binds in its own task
                try:
                    health = await http.get("/health")
                except httpx.TransportError:
                    await trio.sleep(0.01)
        assert health.status_code == 503 and health.json()["status"] == "loading"
        listed = await http.get("/v1/models")
        assert listed.status_code == 200, listed.text
        (card,) = listed.json()["data"]
        assert (card["id"], card["loaded"]) == ("tiny", False)
        assert (await http.get("/v1/models/tiny")).json()["id"] == "tiny"
        refused = await http.post("/v1/chat/completions", json=chat_body(max_tokens=1))
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "model_loading"
        gate.set()
        with trio.fail_after(60):
            while (await http.get("/health")).status_code != 200:  # noqa: ASYNC110
                await trio.sleep(0.01)
        loaded = (await http.get("/v1/models")).json()["data"]
        assert [c["loaded"] for c in loaded] == [True]
        shutdown.set()


async def test_a_request_loads_its_model_and_the_least_recently_used_idle_one_leaves(
    tiny_model: Path,
) -> None:
    async with (
        two_models(tiny_model, max_loaded_models=1) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        assert (await http.get("/health")).status_code == 200  # none preloaded: none to wait for
        cards = await models_by_id(http)
        assert {k: c["loaded"] for k, c in cards.items()} == {"a": False, "b": False}
        assert cards["a"]["context_length"] > 0  # from the model's config, before any load

        first = await chat(http, "a")
        assert first.status_code == 200 and first.json()["model"] == "a"
        models = server.service.models
        assert models is not None
        # A client with its whole answer finds its job gone: the model is idle at once.
        assert not models.find("a").busy
        async with http.stream(
            "POST",
            "/v1/chat/completions",
            json={**chat_body(max_tokens=3, stream=True), "model": "a"},
        ) as streamed:
            assert (await streamed.aread()).endswith(b"data: [DONE]\n\n")
        assert not models.find("a").busy
        assert await loaded_models(http) == {"a": True, "b": False}

        # Two requests for `b` at once: one load, both served; `a` (idle) made room.
        replies: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(lambda: _append(replies, chat(http, "b")))
        assert [r.status_code for r in replies] == [200, 200]
        assert await loaded_models(http) == {"a": False, "b": True}
        metrics = samples((await http.get("/metrics")).text)
        assert value(metrics, "mlx_nursery:model_loads_total", model_name="a") == 1
        assert value(metrics, "mlx_nursery:model_loads_total", model_name="b") == 1
        assert value(metrics, "mlx_nursery:model_unloads_total", model_name="a") == 1
        assert value(metrics, "mlx_nursery:model_loaded", model_name="b") == 1
        assert value(metrics, "mlx_nursery:model_loaded", model_name="a") == 0
        # An unloaded model's counters keep its totals (its first request: 3 greedy tokens).
        assert value(metrics, "mlx_nursery:generation_tokens_total", model_name="a") >= 3

        unknown = await chat(http, "c")
        assert unknown.status_code == 404
        validate_error(unknown.json())
        assert unknown.json()["error"]["code"] == "model_not_found"
        assert "'a', 'b'" in unknown.json()["error"]["message"]
        nameless = await http.post("/v1/chat/completions", json={"messages": []})
        assert nameless.status_code == 400
        assert nameless.json()["error"]["code"] == "missing_required_parameter"


async def _append(replies: list[httpx.Response], reply: Any) -> None:
    replies.append(await reply)


async def test_the_listed_context_is_what_the_memory_budget_serves_before_and_after_a_load(
    tiny_model: Path,
) -> None:
    """A --memory-budget that leaves each model KV for 600 tokens (512 bytes each): the
    engine serves a context of 600 - 256 = 344 (the model's own is 4,096), and the model
    list says 344 before the model loads as after, so a client that trusts it is served."""
    budget = weight_bytes(tiny_model) + 600 * 512
    async with (
        two_models(tiny_model, memory_budget=budget, prompt_cache_bytes=0) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        before = await models_by_id(http)
        assert {k: (c["loaded"], c["context_length"]) for k, c in before.items()} == {
            "a": (False, 344),
            "b": (False, 344),
        }
        assert (await http.get("/v1/models/b")).json()["context_length"] == 344
        assert (await chat(http, "b")).status_code == 200  # loads `b`
        after = await models_by_id(http)
        assert (after["b"]["loaded"], after["b"]["context_length"]) == (True, 344)
        assert engine_of_slot(server, "b").model.context_length == 344
        text = "waves " * 113  # a prompt a few tokens short of the context
        prompt = len(engine_of_slot(server, "b").model.tokenizer.encode(text))
        assert 0 < 344 - prompt <= 8
        fits = await http.post(
            "/v1/completions", json={"model": "b", "prompt": text, "max_tokens": 344 - prompt}
        )
        assert fits.status_code == 200, fits.text
        over = await http.post(
            "/v1/completions", json={"model": "b", "prompt": text, "max_tokens": 345 - prompt}
        )
        assert over.status_code == 400
        assert over.json()["error"]["code"] == "context_length_exceeded"
        await http.post("/v1/models/b/unload")
        assert (await models_by_id(http))["b"]["context_length"] == 344


def engine_of_slot(server: Any, name: str) -> Any:
    hosted = server.service.models.find(name).hosted
    assert hosted is not None
    return hosted.engine


async def test_a_busy_model_stays_and_a_load_that_cannot_fit_is_a_503(tiny_model: Path) -> None:
    weights = weight_bytes(tiny_model)
    kv = 8 << 20  # room for the whole context: the stream below runs long
    one = weights + kv  # a model's reservation: weights, KV, no prefix cache
    async with (
        two_models(
            tiny_model,
            max_loaded_models=2,  # the count allows both: memory decides
            memory_budget=one + one // 2,
            kv_cache_bytes=kv,
            prompt_cache_bytes=0,
        ) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        body = {**chat_body(max_tokens=LONG, temperature=0, stream=True), "model": "a"}
        busy = await raw_http(port_of(server), post_request("/v1/chat/completions", body))
        await read_until(busy, b"data: ")  # `a` is loaded and generating

        refused = await chat(http, "b")
        assert refused.status_code == 503
        validate_error(refused.json())
        assert refused.json()["error"]["code"] == "insufficient_memory"
        assert int(refused.headers["Retry-After"]) >= 1
        unload = await http.post("/v1/models/a/unload")
        assert unload.status_code == 409 and unload.json()["error"]["code"] == "model_busy"
        assert (await loaded_models(http))["a"] is True

        # The stream on `a` was never disturbed: it is still running.
        more = await read_until(busy, b"data: ")
        assert b'"error"' not in more
        await busy.aclose()
        models = server.service.models
        assert models is not None
        await eventually(lambda: not models.find("a").busy, "`a` idle once its job stopped")

        served = await chat(http, "b")
        assert served.status_code == 200 and served.json()["model"] == "b"
        assert await loaded_models(http) == {"a": False, "b": True}


async def test_a_load_beside_a_running_model_disturbs_none_of_its_requests(
    tiny_model: Path,
) -> None:
    async with (
        two_models(tiny_model, max_loaded_models=2) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        assert (await chat(http, "a")).status_code == 200
        chunks: list[dict[str, Any]] = []

        async def stream_on_a() -> None:
            body = {
                **chat_body(max_tokens=300, temperature=0, stream=True),
                "model": "a",
                "stream_options": {"include_usage": True},
            }
            async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
                async for line in reply.aiter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[len("data: ") :]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream_on_a)
            loaded = await chat(http, "b")  # loads `b` while `a` streams
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["model"] == "b"
        # `a`'s stream ran to its end, every token of it.
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 300
        assert await loaded_models(http) == {"a": True, "b": True}


async def test_a_model_larger_than_the_budget_is_refused_and_the_server_goes_on(
    tiny_model: Path,
) -> None:
    async with (
        two_models(tiny_model, memory_budget=1 << 10, kv_cache_bytes=0) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        for _ in range(2):  # and again: the refusal leaves nothing half-loaded
            refused = await chat(http, "a")
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "insufficient_memory"
        assert (await http.get("/health")).status_code == 200


async def test_admin_routes_need_an_admin_key_and_unloading_returns_the_memory(
    tiny_model: Path,
) -> None:
    async with (
        two_models(tiny_model, api_key=("user-key",), admin_key=("root-key",)) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):

        def key(k: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {k}"}

        missing = await http.post("/v1/models/a/load")
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
        user = await http.post("/v1/models/a/load", headers=key("user-key"))
        assert user.status_code == 403
        validate_error(user.json())
        assert user.json()["error"]["code"] == "admin_key_required"

        before = mx.get_active_memory()
        loaded = await http.post("/v1/models/a/load", headers=key("root-key"))
        assert loaded.status_code == 200 and loaded.json()["loaded"] is True
        with_model = mx.get_active_memory()
        weights = weight_bytes(tiny_model)
        assert with_model - before >= 0.9 * weights

        # An admin key is an API key too.
        served = await chat(http, "a")
        assert served.status_code == 401
        served = await http.post(
            "/v1/chat/completions",
            json={**chat_body(max_tokens=2), "model": "a"},
            headers=key("root-key"),
        )
        assert served.status_code == 200

        unloaded = await http.post("/v1/models/a/unload", headers=key("root-key"))
        assert unloaded.status_code == 200 and unloaded.json()["loaded"] is False
        assert mx.get_active_memory() - before < 0.1 * weights, "the weights were not freed"
        again = await http.post("/v1/models/a/unload", headers=key("root-key"))
        assert again.status_code == 200  # unloading what is not loaded: nothing to do


async def test_a_name_with_a_slash_is_served_and_routed(tiny_model: Path) -> None:
    """`--model PATH=org/tiny-chat`: the name is the whole of it, in requests, in the
    model list and in the operators' routes (`/v1/models/org/tiny-chat/unload`)."""
    async with (
        running_server(None, model=(f"{tiny_model}=org/tiny-chat",), skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        assert list(await models_by_id(http)) == ["org/tiny-chat"]
        assert (await chat(http, "org/tiny-chat")).json()["model"] == "org/tiny-chat"
        card = await http.get("/v1/models/org/tiny-chat")
        assert card.status_code == 200 and card.json()["id"] == "org/tiny-chat"
        unloaded = await http.post("/v1/models/org/tiny-chat/unload")
        assert unloaded.status_code == 200 and unloaded.json()["loaded"] is False
        loaded = await http.post("/v1/models/org/tiny-chat/load")
        assert loaded.status_code == 200 and loaded.json()["id"] == "org/tiny-chat"
        assert loaded.json()["loaded"] is True
        other = await http.post("/v1/models/org/other/load")
        assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"


def test_model_sources_from_flags_and_a_models_dir(tmp_path: Path) -> None:
    for name in ("one", "two"):
        (tmp_path / "zoo" / name).mkdir(parents=True)
        (tmp_path / "zoo" / name / "config.json").write_text("{}")
    (tmp_path / "zoo" / "notes").mkdir()  # no config.json: not a model
    (tmp_path / "a=b").mkdir()  # a directory whose name holds '=': a path, not PATH=NAME
    flags = (f"{tmp_path}/x=first", "org/repo", f"{tmp_path}/y=org/y-chat", f"{tmp_path}/a=b")
    sources = model_sources(Settings(model=flags, models_dir=str(tmp_path / "zoo")))
    assert [(s.name, s.spec) for s in sources] == [
        ("first", f"{tmp_path}/x"),
        ("org/repo", "org/repo"),
        ("org/y-chat", f"{tmp_path}/y"),
        ("a=b", f"{tmp_path}/a=b"),
        ("one", str(tmp_path / "zoo" / "one")),
        ("two", str(tmp_path / "zoo" / "two")),
    ]
    assert Settings.from_env({"MLX_NURSERY_MODEL": "a=x, b=y"}).model == ("a=x", "b=y")
    assert [s.name for s in model_sources(Settings())] == ["SmolLM2-135M-Instruct"]
    with pytest.raises(SettingsError, match="two models are served as 'x'"):
        model_sources(Settings(model=("p=x", "q=x")))
    with pytest.raises(SettingsError, match="served-model-name"):
        model_sources(Settings(model=("p", "q"), served_model_name="n"))
