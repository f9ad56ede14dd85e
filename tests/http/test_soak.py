"""A short soak in process (issue 15): mixed requests at concurrency 16 through a real server,
~30% of clients leaving at a random moment and some with short timeouts. Afterwards the engine
holds nothing (no lane borrowed, nobody queued, no active sequence, no late event), it runs
on its one thread, the server still serves, and no engine thread outlives the server.

bench/fuzz_soak.py runs the long soak against a server process and measures what a test should
not (threads, file descriptors, RSS, CPU, time to first token). `MLX_NURSERY_SOAK_REQUESTS`
sets the requests here.
"""

from __future__ import annotations

import collections
import math
import os
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.helpers import engine_threads
from tests.http.test_fuzz import MODEL, Case, Judge, Outcome
from tests.http_helpers import engine_of, eventually, running_server

pytestmark = pytest.mark.slow

REQUESTS = int(os.environ.get("MLX_NURSERY_SOAK_REQUESTS") or 120)
CONCURRENCY = 16
WORDS = [
    "the",
    "lighthouse",
    "keeper",
    "watched",
    "sea",
    "ships",
    "came",
    "and",
    "went",
    "in",
    "storm",
    "harbour",
    "night",
    "long",
    "over",
    "grew",
]


def mixed_request(rng: random.Random, budget: int) -> Case:
    """Chat, completions or Responses; streaming or not; a prompt of a few to ~250 tokens;
    greedy, or sampled with or without a seed."""
    words = rng.choice([rng.randint(1, 20), rng.randint(20, 60), rng.randint(100, 200)])
    prompt = " ".join(rng.choice(WORDS) for _ in range(words))
    sampling: dict[str, Any] = {"temperature": rng.choice([0.0, 0.8, 1.2])}
    endpoint = rng.choice(["chat", "completions", "responses"])
    if endpoint != "responses" and rng.random() < 0.5:
        sampling["seed"] = rng.randint(-(2**63), 2**63 - 1)
    stream = rng.random() < 0.5
    if endpoint == "chat":
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": budget}
    elif endpoint == "completions":
        body = {"prompt": prompt, "max_tokens": budget}
    else:
        body = {"input": prompt, "max_output_tokens": budget, "store": rng.random() < 0.5}
    return Case("valid", endpoint, {"model": MODEL, **body, **sampling, "stream": stream})


async def one(
    http: httpx.AsyncClient,
    rng: random.Random,
    tally: collections.Counter[str],
    failures: list[str],
) -> None:
    behaviour = rng.choices(["complete", "leave", "short_timeout"], weights=[0.6, 0.3, 0.1])[0]
    # Those that leave ask for more: still generating when they go, on a fast machine too.
    case = mixed_request(
        rng, rng.randint(1, 16) if behaviour == "complete" else rng.randint(64, 256)
    )
    tally[behaviour] += 1
    timeout = rng.uniform(0.02, 0.3) if behaviour == "short_timeout" else 120.0
    leave_after, leave_at_event = rng.uniform(0.0, 0.3), rng.randint(0, 5)
    if True:  # a reply left unread closes its connection; the pool opens another
        try:
            with trio.move_on_after(leave_after if behaviour == "leave" else math.inf) as scope:
                async with http.stream("POST", case.url, json=case.body, timeout=timeout) as reply:
                    raw = b""
                    async for chunk in reply.aiter_raw():
                        raw += chunk
                        if (
                            behaviour == "leave"
                            and case.stream
                            and raw.count(b"\n\n") > leave_at_event
                        ):
                            tally["left mid-stream"] += 1
                            return  # leaving the block unread drops the connection
                    outcome = Outcome(case)
                    Judge().judge(outcome, reply, raw)
                    tally[f"status {reply.status_code}"] += 1
                    if outcome.problems:
                        failures.append(outcome.report())
            if scope.cancelled_caught:
                tally["left while waiting"] += 1
        except httpx.TimeoutException:
            tally["timed out"] += 1
        except httpx.HTTPError as exc:
            if behaviour == "complete":
                failures.append(f"{case.describe(200)}: {type(exc).__name__}: {exc}")


async def test_a_soak_with_disconnects_leaves_nothing_behind(tiny_model: Path) -> None:
    threads_before = len(engine_threads())
    rng = random.Random(15)
    tally: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    async with running_server(tiny_model, max_concurrency=8, max_queue=64) as server:
        engine = engine_of(server)
        assert len(engine_threads()) == threads_before + 1
        remaining = [REQUESTS]

        async def client(http: httpx.AsyncClient, seed: int) -> None:
            own = random.Random(seed)
            while remaining[0] > 0:
                remaining[0] -= 1
                await one(http, own, tally, failures)

        limits = httpx.Limits(max_connections=CONCURRENCY)
        async with (
            httpx.AsyncClient(base_url=server.base_url, limits=limits) as http,
            trio.open_nursery() as nursery,
        ):
            for _ in range(CONCURRENCY):
                nursery.start_soon(client, http, rng.randrange(2**32))

        def idle() -> bool:
            stats = engine.statistics()
            return (
                stats.lanes_borrowed == 0
                and stats.queued == 0
                and stats.worker is not None
                and stats.worker.active == 0
            )

        await eventually(idle, "the engine holds no lane, queue slot or sequence")
        stats = engine.statistics()
        assert stats.state == "running" and stats.late_events == 0, stats
        assert len(engine_threads()) == threads_before + 1
        assert not failures, "\n".join(failures[:10])
        left = tally["left mid-stream"] + tally["left while waiting"] + tally["timed out"]
        assert left >= REQUESTS // 10, f"too few clients left early to test anything: {tally}"
        assert tally["status 200"] >= REQUESTS // 3, tally
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            assert (await http.get("/health")).status_code == 200
            reply = await http.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                    "temperature": 0,  # sampled, the tiny model ends on EOS now and then
                },
            )
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    assert len(engine_threads()) == threads_before, "an engine thread outlived the server"
