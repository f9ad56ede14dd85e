"""Server-wide fault injection (`--fault-rate`) over a real server and a real (tiny) model:
statuses before any work, a generation broken after N outputs (its compute stopped), a
stream's connection cut, and the seeded choice of which requests are faulted."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest

from mlx_nursery.settings import SettingsError
from mlx_nursery.testing._fault_rate import parse_fault
from tests.http.test_http_metrics import samples, value
from tests.http_helpers import chat_body, engine_of, eventually, running_server, validate_error

LONG = 3000  # the tiny model never emits EOS at temperature 0


def generated(server: object) -> int:
    stats = engine_of(server).statistics().worker  # type: ignore[arg-type]
    return stats.generated_tokens if stats else 0


async def test_a_status_fault_answers_before_any_work(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, fault_rate=1.0, fault="status:429") as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        for path, body in (
            ("/v1/chat/completions", chat_body(max_tokens=5)),
            ("/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 5}),
            ("/v1/responses", {"model": "tiny", "input": "Hi", "max_output_tokens": 5}),
        ):
            reply = await http.post(path, json=body)
            assert reply.status_code == 429, path
            validate_error(reply.json())
            assert reply.headers["Retry-After"] == "1"
        assert generated(server) == 0
        metrics = samples((await http.get("/metrics")).text)
        assert value(metrics, "mlx_nursery:faults_injected_total", kind="status") == 3


async def test_error_after_breaks_the_generation_and_stops_its_compute(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, fault_rate=1.0, fault="error_after:3") as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        body = chat_body(max_tokens=LONG, temperature=0, stream=True)
        async with http.stream("POST", "/v1/chat/completions", json=body) as streamed:
            raw = (await streamed.aread()).decode()
        events = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
        assert "[DONE]" not in raw
        validate_error(events[-1])
        assert events[-1]["error"]["code"] == "injected_fault"
        content = [
            e for e in events[:-1] if e["choices"] and e["choices"][0]["delta"].get("content")
        ]
        assert 1 <= len(content) <= 3
        # Greedy: sampled, the tiny model may draw EOS before its third output (no fault then).
        reply = await http.post(
            "/v1/chat/completions", json=chat_body(max_tokens=LONG, temperature=0)
        )
        assert reply.status_code == 500 and reply.json()["error"]["code"] == "injected_fault"
        await eventually(lambda: engine_of(server).statistics().lanes_borrowed == 0, "lanes back")
        assert generated(server) < 20, "a broken generation kept computing"
        # A Responses stream told the client its id: it ends with the error and
        # response.failed, and the failed response is stored, as OpenAI's are.
        body = {"model": "tiny", "input": "Hi", "max_output_tokens": LONG, "temperature": 0}
        async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as events:
            raw = (await events.aread()).decode()
        named = [json.loads(e.split("data: ", 1)[1]) for e in raw.split("\n\n") if "data: " in e]
        assert [e["type"] for e in named[-2:]] == ["error", "response.failed"]
        failed = named[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
        stored = await http.get(f"/v1/responses/{failed['id']}")
        assert stored.status_code == 200 and stored.json()["status"] == "failed"


async def test_drop_after_cuts_a_streams_connection(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, fault_rate=1.0, fault="drop_after:2") as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        body = chat_body(max_tokens=LONG, temperature=0, stream=True)
        received = b""
        with pytest.raises(httpx.RemoteProtocolError):
            async with http.stream("POST", "/v1/chat/completions", json=body) as streamed:
                async for data in streamed.aiter_bytes():
                    received += data
        assert b'"error"' not in received and b"[DONE]" not in received
        await eventually(lambda: engine_of(server).statistics().lanes_borrowed == 0, "lanes back")
        assert generated(server) < 20


async def test_the_seed_decides_which_requests_are_faulted(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, fault_rate=0.5, fault="status:503", fault_seed=7) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        statuses = [
            (await http.post("/v1/chat/completions", json=chat_body(max_tokens=1))).status_code
            for _ in range(12)
        ]
    draws = random.Random(7)
    assert statuses == [503 if draws.random() < 0.5 else 200 for _ in range(12)]
    assert 0 < statuses.count(503) < 12


def test_faults_are_checked_at_startup() -> None:
    assert (parse_fault("drop_after:4").kind, parse_fault("drop_after:4").value) == (
        "drop_after",
        4,
    )
    for bad in ("status:404", "error_after:0", "hang:3", "status:"):
        with pytest.raises(SettingsError):
            parse_fault(bad)
