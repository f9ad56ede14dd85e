"""A failure inside the server's own code fails only its request: faults injected at each
named point of a request's life (`mlx_nursery.fault_points`) over a real server.

For each point: the request it is armed for fails (a 500 `internal_error` or another 5xx in
the envelope, or an error event ending its stream); requests running beside it on the same
model and on another model get the output they get alone; `/health` stays 200; every lane,
job and preparation slot comes back. An engine thread that dies is the one failure that is
not a request's: its model is restarted, or the server exits non-zero, as configured.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import trio

from mlx_nursery.fault_points import Point
from mlx_nursery.server import Running, serve
from mlx_nursery.settings import Settings
from mlx_nursery.testing import injected_fault
from tests.http_helpers import eventually, running_server, validate_error
from tests.speech_helpers import clip, wav_bytes

PROMPT = [{"role": "user", "content": "Tell me about the sea."}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
]


def chat(model: str, *, stream: bool = False, **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
        **fields,
    }


async def answer(http: httpx.AsyncClient, body: dict[str, Any]) -> str:
    reply = await http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


async def failed(http: httpx.AsyncClient, path: str, body: dict[str, Any], rid: str) -> str:
    """Send the faulted request; what it ended with: an error code, or `cut` for a stream
    whose connection ended without an event."""
    headers = {"x-request-id": rid}
    if not body.get("stream"):
        reply = await http.post(path, json=body, headers=headers)
        assert reply.status_code >= 500, reply.text
        validate_error(reply.json())
        return str(reply.json()["error"]["code"])
    try:
        async with http.stream("POST", path, json=body, headers=headers) as streamed:
            if streamed.status_code != 200:
                await streamed.aread()
                validate_error(streamed.json())
                return str(streamed.json()["error"]["code"])
            raw = (await streamed.aread()).decode()
    except httpx.RemoteProtocolError:
        return "cut"
    assert "[DONE]" not in raw
    events = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    if not events or "error" not in events[-1]:
        return "cut"
    validate_error(events[-1])
    return str(events[-1]["error"]["code"])


async def settled(server: Running) -> None:
    """Every lane, job and preparation slot is back; /health is 200."""
    models = server.service.models
    assert models is not None

    def idle() -> bool:
        return all(
            slot.hosted is not None
            and not slot.busy
            and slot.hosted.engine.limiter.borrowed_tokens == 0
            for slot in models.slots
        )

    await eventually(idle, "every lane and job back")
    assert server.parts.preparation.preparing == 0
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        health = await http.get("/health")
    assert health.status_code == 200, health.text
    assert health.json() == {"status": "ok"}


# point -> (path, the faulted request's body); every one runs on model "a"
TEXT_POINTS: dict[Point, tuple[str, dict[str, Any]]] = {
    "parse": ("/v1/chat/completions", chat("a")),
    "template": ("/v1/chat/completions", chat("a")),
    "tokenize": ("/v1/chat/completions", chat("a", stream=True)),
    "admission": ("/v1/chat/completions", chat("a", stream=True)),
    "prefix_fetch": ("/v1/chat/completions", chat("a")),
    "prefill": ("/v1/chat/completions", chat("a", stream=True)),
    "decode_step": ("/v1/chat/completions", chat("a", stream=True)),
    "sampler": ("/v1/chat/completions", chat("a", stream=True)),
    "logits_processor": ("/v1/chat/completions", chat("a")),
    "detokenize": ("/v1/chat/completions", chat("a", stream=True)),
    "tool_call_parse": ("/v1/chat/completions", chat("a", stream=True, tools=TOOLS)),
    "rendering": ("/v1/chat/completions", chat("a", stream=True)),
    "sse_write": ("/v1/chat/completions", chat("a", stream=True)),
    "store_write": (
        "/v1/responses",
        {"model": "a", "input": "Hi", "max_output_tokens": 8, "temperature": 0, "store": True},
    ),
}


async def test_a_fault_at_each_point_fails_only_its_request(
    tiny_model: Path, thinking_model: Path
) -> None:
    async with (
        running_server(
            None,
            model=(f"{tiny_model}=a", f"{tiny_model}=b", f"{thinking_model}=t"),
            max_loaded_models=3,
            preload=("a", "b", "t"),
        ) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        neighbours = [chat("a", max_tokens=24), chat("b", max_tokens=24)]
        alone = [await answer(http, body) for body in neighbours]
        points: dict[Point, tuple[str, dict[str, Any]]] = {
            **TEXT_POINTS,
            "reasoning_split": ("/v1/chat/completions", chat("t", stream=True)),
        }
        for point, (path, body) in points.items():
            results = await beside(http, point, path, body, neighbours)
            assert results[1:] == alone, point
            await settled(server)


async def beside(
    http: httpx.AsyncClient,
    point: Point,
    path: str,
    body: dict[str, Any],
    neighbours: list[dict[str, Any]],
) -> list[str]:
    """The faulted request at `point` (its error code), with `neighbours` sent beside it
    (their answers)."""
    rid = f"fault-{point}"
    results = ["", *("" for _ in neighbours)]

    async def target() -> None:
        results[0] = await failed(http, path, body, rid)

    async def neighbour(i: int) -> None:
        results[i + 1] = await answer(http, neighbours[i])

    with injected_fault(point, rid):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(target)
            for i in range(len(neighbours)):
                nursery.start_soon(neighbour, i)
    assert results[0], point
    return results


async def test_a_fault_in_an_embedding_forward_or_a_whisper_window_fails_only_its_request(
    tiny_embedding: Path, tiny_whisper: Path, tiny_model: Path
) -> None:
    async with (
        running_server(
            None,
            model=(f"{tiny_embedding}=emb", f"{tiny_whisper}=whisper", f"{tiny_model}=a"),
            max_loaded_models=3,
            preload=("emb", "whisper", "a"),
        ) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        embed = {"model": "emb", "input": ["the sea", "the sky"]}
        alone = (await http.post("/v1/embeddings", json=embed)).json()["data"]
        alone_chat = await answer(http, chat("a"))
        with injected_fault("embedding_forward", "fault-embed"):
            reply = await http.post(
                "/v1/embeddings", json=embed, headers={"x-request-id": "fault-embed"}
            )
            assert reply.status_code >= 500
            validate_error(reply.json())
            again = await http.post("/v1/embeddings", json=embed)
            assert again.json()["data"] == alone
        audio = {"file": ("clip.wav", wav_bytes(clip(1.0)), "audio/wav")}
        with injected_fault("whisper_window", "fault-whisper"):
            reply = await http.post(
                "/v1/audio/transcriptions",
                files=audio,
                data={"model": "whisper"},
                headers={"x-request-id": "fault-whisper"},
            )
            assert reply.status_code >= 500
            validate_error(reply.json())
            ok = await http.post("/v1/audio/transcriptions", files=audio, data={"model": "whisper"})
            assert ok.status_code == 200, ok.text
        assert await answer(http, chat("a")) == alone_chat
        await settled(server)


async def test_a_dead_engine_is_restarted_and_its_model_serves_again(tiny_model: Path) -> None:
    async with (
        running_server(
            None,
            model=(f"{tiny_model}=a", f"{tiny_model}=b"),
            max_loaded_models=2,
            preload=("a", "b"),
        ) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        alone = [await answer(http, chat(m)) for m in ("a", "b")]
        with injected_fault("engine_loop", "fault-engine"):
            assert await failed(http, "/v1/chat/completions", chat("a"), "fault-engine")
        models = server.service.models
        assert models is not None
        await eventually(lambda: models.find("a").restarts == 1, "the engine restarted")
        await eventually(lambda: not server.service.problems(), "the model serves again")
        assert [await answer(http, chat(m)) for m in ("a", "b")] == alone
        await settled(server)


async def test_a_request_prepared_before_its_engine_died_gets_a_503_to_retry(
    tiny_model: Path,
) -> None:
    """A request that found the model loaded, and starts its job after the engine died and
    the model's nursery closed, is told to retry (503 `model_restarting`), not a 500."""
    entered, gate = threading.Event(), threading.Event()

    def hold(body: dict[str, Any]) -> tuple[()]:
        if body.get("user") == "held":  # on the preparation's worker thread
            entered.set()
            gate.wait(60)
        return ()

    async with (
        running_server(tiny_model, extra_processors=hold) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        replies: list[httpx.Response] = []

        async def held() -> None:
            replies.append(await http.post("/v1/chat/completions", json=chat("tiny", user="held")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(held)
            await eventually(entered.is_set, "the request is being prepared")
            with injected_fault("engine_loop", "fault-engine"):
                assert await failed(http, "/v1/chat/completions", chat("tiny"), "fault-engine")
            models = server.service.models
            assert models is not None
            await eventually(lambda: models.find("tiny").restarts == 1, "the old engine is gone")
            gate.set()
        (reply,) = replies
        assert reply.status_code == 503, reply.text
        validate_error(reply.json())
        assert reply.json()["error"]["code"] == "model_restarting"
        assert reply.headers["Retry-After"] == "1"
        await eventually(lambda: not server.service.problems(), "the model serves again")
        assert await answer(http, chat("tiny"))
        await settled(server)


async def test_a_dead_engine_past_its_restarts_reports_unhealthy_and_exits_1(
    tiny_model: Path,
) -> None:
    settings = Settings(
        model=(f"{tiny_model}=a", f"{tiny_model}=b"),
        max_loaded_models=2,
        preload=("a", "b"),
        on_engine_failure="exit",
        shutdown_grace=30,
        responses_db=":memory:",
        port=0,
    )
    status: list[int] = []

    async def run(task_status: trio.TaskStatus[Running]) -> None:
        status.append(await serve(settings, handle_signals=False, task_status=task_status))

    async with trio.open_nursery() as nursery:
        server: Running = await nursery.start(run)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            # A stream on the other model keeps the drain open, so /health can be read.
            body = chat("b", stream=True, max_tokens=3000, temperature=0)
            async with http.stream("POST", "/v1/chat/completions", json=body) as holding:
                lines = holding.aiter_lines()
                await anext(lines)
                with injected_fault("engine_loop", "fault-exit"):
                    await failed(http, "/v1/chat/completions", chat("a"), "fault-exit")
                await eventually(lambda: server.service.stopped_by_failure.is_set(), "exit")
                health = await http.get("/health")
                assert health.status_code == 503
                report = health.json()
                assert report["status"] == "failed"
                assert {p["model"] for p in report["problems"]} >= {"a"}
                assert all(p["since"].endswith("Z") for p in report["problems"])
                refused = await http.post("/v1/chat/completions", json=chat("b"))
                assert refused.status_code == 503
                assert refused.headers["Retry-After"] == "1"
    assert status == [1]
