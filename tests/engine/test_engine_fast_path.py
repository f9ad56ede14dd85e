"""The single-sequence fast path: a lone sequence runs outside BatchGenerator, with the same tokens.

Each request runs three ways: alone on the fast path, alone through BatchGenerator (fast
path off), and handed over from the fast path to the batch mid-stream when company
arrives. All three must give the same tokens.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from tests.helpers import Run, collect, request

SAMPLINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "seeded": SamplingParams(temperature=1.0, top_p=0.9, seed=5),
    "penalties": SamplingParams(
        temperature=0.0,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        repetition_penalty=1.3,
        logit_bias={17: 8.0},
    ),
}


def _solo_steps(engine: Engine) -> int:
    stats = engine.statistics().worker
    return stats.solo_steps if stats else 0


async def _handed_over(
    engine: Engine, first: GenerationRequest, second: GenerationRequest, after: int
) -> tuple[Run, Run]:
    """Run `first` alone; once it has produced `after` events, start `second` beside it."""
    runs: dict[str, Run] = {}
    company = trio.Event()

    async def run_second() -> None:
        await company.wait()
        async with engine.generate(second) as stream:
            runs["second"] = Run([e async for e in stream])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_second)
        async with engine.generate(first) as stream:
            events = []
            async for event in stream:
                events.append(event)
                if len(events) == after:
                    company.set()
            runs["first"] = Run(events)
    return runs["first"], runs["second"]


@pytest.mark.parametrize("sampling", list(SAMPLINGS.values()), ids=list(SAMPLINGS))
async def test_fast_path_gives_the_batch_paths_tokens(
    tiny_model: Path, sampling: SamplingParams
) -> None:
    config = EngineConfig(tiny_model, max_concurrency=4, prefill_step_size=16)
    prompt_text = "The lighthouse keeper counted the waves, one by one, until the morning. " * 3
    async with open_engine(attrs.evolve(config, single_sequence_fast_path=False)) as batch_only:
        first = request(
            batch_only, prompt_text, max_tokens=24, sampling=sampling, ignore_eos=True, logprobs=2
        )
        second = request(
            batch_only, "Another voice", max_tokens=30, sampling=sampling, ignore_eos=True
        )
        reference = await collect(batch_only, first)
        reference_second = await collect(batch_only, second)
        assert _solo_steps(batch_only) == 0
    async with open_engine(attrs.evolve(config, prompt_cache_bytes=0)) as fast:
        alone = await collect(fast, first)
        assert _solo_steps(fast) > 0
        handed, companion = await _handed_over(fast, first, second, after=6)
        stats = fast.statistics()
        assert stats.lanes_borrowed == 0 and stats.late_events == 0
        assert stats.worker is not None and stats.worker.handovers == 1
    assert alone.tokens == reference.tokens
    assert handed.tokens == reference.tokens
    assert companion.tokens == reference_second.tokens
    assert handed.final.usage == reference.final.usage
    for ours, theirs in zip(alone.events, reference.events, strict=True):
        if ours.logprob is not None and theirs.logprob is not None:
            assert ours.logprob.token_id == theirs.logprob.token_id
            assert ours.logprob.logprob == pytest.approx(theirs.logprob.logprob, abs=1e-4)
            assert [t for t, _ in ours.logprob.top] == [t for t, _ in theirs.logprob.top]


async def test_fast_path_prefix_cache_and_cancel(tiny_model: Path) -> None:
    config = EngineConfig(tiny_model, max_concurrency=2, prefill_step_size=16)
    async with open_engine(config) as engine:
        text = "A long shared prefix for the cache, repeated to span chunks. " * 6
        cold = await collect(engine, request(engine, text, max_tokens=8, ignore_eos=True))
        warm = await collect(engine, request(engine, text, max_tokens=8, ignore_eos=True))
        assert warm.tokens == cold.tokens
        assert warm.final.usage is not None and warm.final.usage.cached_tokens > 0
        with trio.CancelScope() as scope:
            async with engine.generate(
                request(engine, text + " more", max_tokens=500, ignore_eos=True)
            ) as stream:
                async for _ in stream:
                    scope.cancel()
        assert (
            stream.steps_in_flight_at_cancel is not None and stream.steps_in_flight_at_cancel <= 1
        )
        stats = engine.statistics()
        assert stats.lanes_borrowed == 0 and stats.late_events == 0
        assert stats.worker is not None and stats.worker.generated_tokens < 100


class DeliveryGate:
    """A logits processor that, while the engine builds token n's graph, waits until the
    consumer holds the tokens the engine owes it by then, and records n if it never does."""

    def __init__(self, owed: Any) -> None:
        self._owed = owed
        self._received = 0
        self._calls = 0
        self._changed = threading.Condition()
        self.held_back: list[int] = []

    def received(self) -> None:
        with self._changed:
            self._received += 1
            self._changed.notify_all()

    def __call__(self, tokens: Any, logits: Any) -> Any:
        self._calls += 1
        owed = self._owed(self._calls)
        with self._changed:  # the timeout only ends a deadlock; a held-back token causes one
            if not self._changed.wait_for(lambda: self._received >= owed, timeout=10):
                self.held_back.append(self._calls)
        return logits


async def test_fast_path_holds_a_token_back_one_launch_at_most_and_never_the_first(
    tiny_model: Path,
) -> None:
    """Tokens of a lone stream reach Trio at the next launch, outside the graph build
    (the outbox's posting rule): token k is read after token k+1 is launched and posted once
    token k+2's graph is built, so it must be there while token k+3's graph is built. The
    first token has no launch of its own to wait for: it is there before the second's."""

    def owed(call: int) -> int:
        return 1 if call == 2 else max(0, call - 3)

    gate = DeliveryGate(owed)
    async with open_engine(EngineConfig(tiny_model, max_concurrency=2)) as engine:
        run_events = []
        async with engine.generate(
            request(
                engine,
                "Counting tokens as they come",
                max_tokens=12,
                ignore_eos=True,
                logits_processors=[gate],
            )
        ) as stream:
            async for event in stream:
                run_events.append(event)
                if event.token_id is not None:
                    gate.received()
        assert _solo_steps(engine) > 0
    run = Run(run_events)
    assert run.final.finish_reason == "length" and len(run.tokens) == 12
    assert gate.held_back == []


def test_handover_in_the_middle_of_a_chunked_prefill(tiny_model: Path) -> None:
    """White-box: hand a sequence over between prefill chunks; the batch finishes it identically."""
    from mlx_lm.generate import BatchGenerator, StopSequences
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load

    from mlx_nursery.engine._solo_sequence import SoloSequence
    from mlx_nursery.engine._stepper import Start

    model, tokenizer = load(str(tiny_model))
    prompt = tokenizer.encode("Waves and more waves, counted through the night. " * 8)
    greedy = make_sampler(temp=0.0)

    def batch_run(
        prompt_part: list[int], cache: object, cache_tokens: list[int], n: int
    ) -> list[int]:
        generator = BatchGenerator(model, prefill_step_size=16)
        generator.insert(
            [prompt_part],
            max_tokens=[n],
            caches=[cache] if cache else None,
            all_tokens=[cache_tokens],
            samplers=[greedy],
            logits_processors=[[]],
            stop_sequences=[StopSequences([])],
        )
        tokens: list[int] = []
        while len(tokens) < n:
            tokens += [r.token for r in generator.next()[1]]
        generator.close()
        return tokens

    reference = batch_run(prompt, None, [], 12)
    solo = SoloSequence(
        model,
        -1,
        Start(prompt, None, [], 12),
        sampler=greedy,
        processors=[],
        stop_tokens=frozenset(),
        prefill_step_size=16,
    )
    assert solo.step() == [] and solo.step() == []  # two prefill chunks, no token yet
    handover = solo.handover()
    start = handover.start
    assert handover.response is None and start.cache_tokens == prompt[:32]
    assert start.prompt == prompt[32:] and start.max_tokens == 12
    assert batch_run(start.prompt, start.cache, start.cache_tokens, 12) == reference


async def test_a_failed_handover_fails_only_that_request(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlx_nursery.engine._stepper import BatchStepper, Start

    original = BatchStepper.insert

    def failing_for_handed_over(self: BatchStepper, sequence: Any, start: Start) -> int:
        if start.cache is not None:  # only the lone sequence arrives with a KV cache here
            raise RuntimeError("simulated insert failure")
        return original(self, sequence, start)

    monkeypatch.setattr(BatchStepper, "insert", failing_for_handed_over)
    config = EngineConfig(tiny_model, max_concurrency=4, prompt_cache_bytes=0)
    async with open_engine(config) as engine:
        first = request(engine, "A lone request", max_tokens=40, ignore_eos=True)
        second = request(engine, "Company", max_tokens=5, ignore_eos=True)
        lone, companion = await _handed_over(engine, first, second, after=3)
        assert lone.final.finish_reason == "error"
        assert companion.final.finish_reason == "length" and len(companion.tokens) == 5
        stats = engine.statistics()
        assert engine.healthy and stats.lanes_borrowed == 0 and stats.late_events == 0
