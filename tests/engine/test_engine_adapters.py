"""LoRA adapters per request: rows of the base and of different adapters decode in one batch,
each exactly as it would alone (engine/_adapters.py, models/_lora.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from mlx_nursery.engine import (
    AdapterBusy,
    Engine,
    EngineConfig,
    GenerationRequest,
    UnknownAdapter,
    open_engine,
)
from mlx_nursery.tools import make_adapter
from tests.helpers import Run, collect, collect_all, request

PROMPTS = {
    None: "The lighthouse keeper counted the waves, one by one, until the morning came.",
    "a": "Another voice",
    "b": "A third, somewhat longer prompt about the sea and its many moods",
}


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("adapters")
    return {
        "a": make_adapter(folder / "a", tiny_model, seed=1, rank=4, layers=2),
        "b": make_adapter(
            folder / "b", tiny_model, seed=2, rank=8, layers=1, keys=("q_proj", "k_proj", "up_proj")
        ),
    }


def _config(model: Path, adapters: dict[str, Path], **kwargs: object) -> EngineConfig:
    return EngineConfig(
        model,
        max_concurrency=8,
        prefill_step_size=16,
        warmup=False,
        adapters=tuple(adapters.items()),
        **kwargs,  # type: ignore[arg-type]
    )


def _requests(engine: Engine, names: list[str | None]) -> list[GenerationRequest]:
    return [
        request(engine, PROMPTS[name], max_tokens=12, ignore_eos=True, adapter=name)
        for name in names
    ]


async def test_a_batch_of_adapters_gives_each_row_its_solo_tokens(
    tiny_model: Path, adapters: dict[str, Path]
) -> None:
    names: list[str | None] = [None, "a", "b", "a", None, "b"]
    async with open_engine(_config(tiny_model, adapters, prompt_cache_bytes=0)) as engine:
        alone = {
            name: await collect(engine, req)
            for name, req in zip(names[:3], _requests(engine, names[:3]), strict=True)
        }
        together = await collect_all(engine, _requests(engine, names))
        stats = engine.statistics().worker
    assert stats is not None and stats.steps > stats.solo_steps  # the rows shared batch steps
    for name, run in zip(names, together, strict=True):
        assert run.tokens == alone[name].tokens, name
    base = alone[None].tokens
    assert len({tuple(base), tuple(alone["a"].tokens), tuple(alone["b"].tokens)}) == 3


class _Decoded:
    """A logits processor that keeps how many tokens its row had generated at its last
    decode step (called on the engine thread with the prompt and every token fed so far)."""

    def __init__(self, prompt: int) -> None:
        self.prompt, self.generated = prompt, 0

    def __call__(self, tokens: Any, logits: Any) -> Any:
        self.generated = max(self.generated, len(tokens) - self.prompt)
        return logits


async def test_cancelling_one_row_leaves_the_others_exact(
    tiny_model: Path, adapters: dict[str, Path]
) -> None:
    """The victim (adapter b) decodes in one batch with a base row and rows of a and b, and
    is cancelled once every other row has tokens out, with most of theirs still to come: the
    others' outputs are their solo outputs, token for token."""
    length, seen = 32, 4
    async with open_engine(_config(tiny_model, adapters, prompt_cache_bytes=0)) as engine:
        names: list[str | None] = [None, "a", "b"]
        others = [
            request(engine, PROMPTS[name], max_tokens=length, ignore_eos=True, adapter=name)
            for name in names
        ]
        alone = [await collect(engine, req) for req in others]
        prompt = engine.model.tokenizer.encode(PROMPTS["a"])
        decoded = _Decoded(len(prompt))
        victim = request(
            engine, PROMPTS["a"], max_tokens=200, ignore_eos=True, adapter="b",
            logits_processors=(decoded,),
        )  # fmt: skip
        runs: list[Run] = [Run([]) for _ in others]
        all_decoding = trio.Event()
        stopped: list[int] = []

        async def other(i: int) -> None:
            async with engine.generate(others[i]) as stream:
                async for event in stream:
                    runs[i].events.append(event)
                    if all(len(run.tokens) >= seen for run in runs):
                        all_decoding.set()

        async def cancelled_one() -> None:
            with trio.CancelScope() as scope:
                async with engine.generate(victim) as stream:
                    async for _ in stream:
                        if all_decoding.is_set():
                            scope.cancel()
            stopped.append(decoded.generated)  # leaving the block: its compute stopped

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancelled_one)
            for i in range(len(others)):
                nursery.start_soon(other, i)
        stats = engine.statistics().worker
    assert stats is not None and stats.steps > stats.solo_steps  # rows shared batch steps
    assert stopped == [decoded.generated], "the victim decoded after its block was left"
    assert seen <= decoded.generated < length, "the victim stopped amid the others' decoding"
    for run, reference in zip(runs, alone, strict=True):
        assert run.tokens == reference.tokens


async def test_adapters_load_and_unload_at_runtime(
    tiny_model: Path, adapters: dict[str, Path]
) -> None:
    async with open_engine(_config(tiny_model, {"a": adapters["a"]})) as configured:
        expected = await collect(configured, _requests(configured, ["a"])[0])
    config = _config(tiny_model, {}, enable_adapters=True)
    async with open_engine(config) as engine:
        with pytest.raises(UnknownAdapter):
            await collect(engine, _requests(engine, ["a"])[0])
        assert await engine.load_adapter("a", adapters["a"]) > 0
        assert engine.adapters.keys() == {"a"}
        loaded = await collect(engine, _requests(engine, ["a"])[0])
        assert loaded.tokens == expected.tokens
        long = request(engine, PROMPTS["a"], max_tokens=200, ignore_eos=True, adapter="a")
        async with engine.generate(long) as stream:
            await stream.__anext__()
            with pytest.raises(AdapterBusy):
                await engine.unload_adapter("a")
        await engine.unload_adapter("a")
        with pytest.raises(UnknownAdapter):
            await collect(engine, _requests(engine, ["a"])[0])
        base = await collect(engine, _requests(engine, [None])[0])
        assert base.tokens != expected.tokens


async def test_the_prefix_cache_keeps_each_adapters_kv_apart(
    tiny_model: Path, adapters: dict[str, Path]
) -> None:
    """The same prompt under the base and two adapters: each reads only its own KV from the
    prefix cache (another's would give it another's output)."""
    names: list[str | None] = ["a", None, "b", "a", None]
    prompt = PROMPTS["b"]
    runs = {}
    for cache_bytes in (0, 64 << 20):
        async with open_engine(_config(tiny_model, adapters, prompt_cache_bytes=cache_bytes)) as e:
            requests = [
                request(e, prompt, max_tokens=8, ignore_eos=True, adapter=name) for name in names
            ]
            runs[cache_bytes] = [await collect(e, req) for req in requests]
    cached = runs[64 << 20]
    assert cached[3].final.usage is not None and cached[3].final.usage.cached_tokens > 0
    assert [r.tokens for r in cached] == [r.tokens for r in runs[0]]
    assert cached[0].tokens != cached[1].tokens != cached[2].tokens
