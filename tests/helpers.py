"""Helpers for driving the real engine in tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import attrs
import trio

from mlx_nursery.engine import THREAD_NAME, Engine, GenerationRequest, SamplingParams, TokenEvent


@attrs.define
class Run:
    events: list[TokenEvent]

    @property
    def tokens(self) -> list[int]:
        return [e.token_id for e in self.events if e.token_id is not None]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def final(self) -> TokenEvent:
        return self.events[-1]


async def collect(engine: Engine, request: GenerationRequest) -> Run:
    async with engine.generate(request) as stream:
        return Run([event async for event in stream])


async def collect_all(engine: Engine, requests: list[GenerationRequest]) -> list[Run]:
    """Run `requests` concurrently; results in request order."""
    runs: list[Run | None] = [None] * len(requests)

    async def one(i: int) -> None:
        runs[i] = await collect(engine, requests[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(requests)):
            nursery.start_soon(one, i)
    return [run for run in runs if run is not None]


def request(engine: Engine, text: str, **kwargs: Any) -> GenerationRequest:
    kwargs.setdefault("max_tokens", 24)
    kwargs.setdefault("sampling", SamplingParams(temperature=0.0))
    return GenerationRequest(engine.model.tokenizer.encode(text), **kwargs)


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


class CallSignal:
    """A logits processor that sets a Trio event from the engine thread on its n-th call."""

    def __init__(self, token: trio.lowlevel.TrioToken, after_calls: int) -> None:
        self.event = trio.Event()
        self.calls = 0
        self._token = token
        self._after = after_calls

    def arm(self, more_calls: int) -> None:
        """Fire `more_calls` calls from now instead (the engine thread keeps calling meanwhile)."""
        self._after = self.calls + more_calls

    def __call__(self, tokens: Any, logits: Any) -> Any:
        self.calls += 1
        if self.calls == self._after:
            trio.from_thread.run_sync(self.event.set, trio_token=self._token)
        return logits


def raising_processor(after_calls: int, exc: Callable[[], BaseException]) -> Any:
    calls = 0

    def processor(tokens: Any, logits: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls >= after_calls:
            raise exc()
        return logits

    return processor
