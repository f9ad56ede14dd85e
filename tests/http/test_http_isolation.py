"""The requests that used to kill the engine for everyone, through the real server: each is
served (or refused) on its own, /health stays 200, and sampling still works afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from tests.http_helpers import chat_body, engine_of, running_server

ENGINE_KILLERS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", chat_body("hi", max_tokens=4, temperature=1.0, seed=-1)),
    ("/v1/chat/completions", chat_body("hi", max_tokens=4, temperature=1.0, seed=-(1 << 63))),
    ("/v1/chat/completions", chat_body("hi", max_tokens=4, temperature=1.0, seed=(1 << 63) - 1)),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 4, "seed": -1}),
    ("/v1/chat/completions", chat_body("hi", max_tokens=4, temperature=0.7, top_k=2048)),
    ("/v1/chat/completions", chat_body("hi", max_tokens=4, temperature=0.7, top_k=(1 << 63) - 1)),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 4, "top_k": 4096}),
]


async def test_requests_that_killed_the_engine_are_served_alone(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        greedy = chat_body("Tell me a story.", max_tokens=24, temperature=0)
        before = (await http.post("/v1/chat/completions", json=greedy)).json()
        beside: list[dict[str, Any]] = []

        async def greedy_stream_beside() -> None:
            beside.append((await http.post("/v1/chat/completions", json=greedy)).json())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(greedy_stream_beside)
            for path, body in ENGINE_KILLERS:
                response = await http.post(path, json=body)
                assert response.status_code == 200, (body, response.text)
                assert (await http.get("/health")).status_code == 200

        # A greedy request beside them had exactly its tokens; unseeded sampling still works.
        assert beside[0]["choices"][0]["message"] == before["choices"][0]["message"]
        sampled = await http.post(
            "/v1/chat/completions", json=chat_body("hi", max_tokens=8, temperature=1.0)
        )
        assert sampled.status_code == 200 and sampled.json()["usage"]["completion_tokens"] > 0
        stats = engine_of(server).statistics()
        assert (
            stats.state == "running" and stats.worker is not None and stats.worker.failed_steps == 0
        )


async def test_seeds_beyond_64_bits_are_refused_by_name(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        for seed in (1 << 64, -(1 << 63) - 1):
            response = await http.post(
                "/v1/chat/completions", json=chat_body("hi", max_tokens=2, seed=seed)
            )
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == "seed"
        assert (await http.get("/health")).status_code == 200
