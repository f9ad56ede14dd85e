"""One key cannot stall or read another's work through the engine: lanes go fairly among
keys, one key may hold only its share of the queue, and each key's prompts are cached apart
(unless --shared-prefix-cache), so cached-token counts tell nothing of another key's prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from tests.http_helpers import chat_body, engine_of, eventually, running_server, validate_error

KEYS = ("key-a", "key-b")
SECRET = "The launch code is 7-4-1-9 and the vault is behind the third painting. " * 4


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def cached(http: httpx.AsyncClient, key: str) -> int:
    body = chat_body(SECRET, max_tokens=1, temperature=0)
    reply = await http.post("/v1/chat/completions", json=body, headers=auth(key))
    assert reply.status_code == 200, reply.text
    return int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_each_keys_prompts_are_cached_apart_unless_shared(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, api_key=KEYS) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        assert await cached(http, "key-a") == 0
        assert await cached(http, "key-a") > 0  # the cache works for its own key
        assert await cached(http, "key-b") == 0  # and tells the other key nothing
    async with (
        running_server(tiny_model, api_key=KEYS, shared_prefix_cache=True) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        assert await cached(http, "key-a") == 0
        assert await cached(http, "key-b") > 0


async def test_a_key_filling_lanes_and_queue_leaves_another_served_next(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, api_key=KEYS, max_concurrency=1, max_queue=6) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        lanes = engine_of(server).limiter
        finished: list[str] = []

        async def ask(name: str, key: str, **fields: Any) -> None:
            body = chat_body(max_tokens=4, temperature=0, **fields)
            reply = await http.post("/v1/chat/completions", json=body, headers=auth(key))
            assert reply.status_code == 200, reply.text
            finished.append(name)

        holding = chat_body(max_tokens=3000, temperature=0, stream=True)
        lane_held = trio.Event()

        async def hold(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                async with http.stream(
                    "POST", "/v1/chat/completions", json=holding, headers=auth("key-a")
                ) as running:
                    async for _ in running.aiter_lines():  # a reader: the lane stays held
                        lane_held.set()

        async with trio.open_nursery() as nursery:
            holder: trio.CancelScope = await nursery.start(hold)
            await lane_held.wait()  # key A holds the one lane
            for i in range(3):  # and its share of the queue (half of 6)
                nursery.start_soon(ask, f"a{i}", "key-a")
                await eventually(lambda i=i: lanes.statistics().tasks_waiting == i + 1, "a")
            refused = await http.post(
                "/v1/chat/completions", json=chat_body(max_tokens=4), headers=auth("key-a")
            )
            assert refused.status_code == 503
            validate_error(refused.json())
            nursery.start_soon(ask, "b", "key-b")  # key B still finds room
            await eventually(lambda: lanes.statistics().tasks_waiting == 4, "b queued")
            holder.cancel()  # A's stream ends: its lane goes to B, who holds none
        assert finished == ["b", "a0", "a1", "a2"]
