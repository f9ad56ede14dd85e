"""One request can never take the engine down: failures that belong to one sequence end
that sequence alone, and the rest of the batch goes on with the tokens it would have had.

Failures are injected where the worker meets per-request work: building the sampler and
processors, fetching a cached prefix, handing a lone sequence over to the batch, sampling,
and inside a batch step where no guard can see whose it is (an array that fails at eval).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
import trio

from mlx_nursery.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    _prefix_cache,
    _sampling,
    _sequence,
    _solo_sequence,
    open_engine,
)
from tests.helpers import CallSignal, Run, collect, collect_all, request

PROMPTS = [
    "What is the capital of France?",
    "hello world",
    "list of numbers: 1 2 3",
    "The weather today is",
    "please call the tool with arguments",
]
GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=5)


def batch(engine: Engine, **kwargs: Any) -> list[GenerationRequest]:
    """Healthy requests, greedy and seeded: what the batch must keep producing."""
    kwargs.setdefault("max_tokens", 16)
    return [
        request(engine, p, sampling=GREEDY if i % 2 else SEEDED, ignore_eos=True, **kwargs)
        for i, p in enumerate(PROMPTS[:4])
    ]


async def run_beside(
    engine: Engine, healthy: list[GenerationRequest], doomed: GenerationRequest
) -> tuple[list[Run], Run]:
    runs = await collect_all(engine, [*healthy, doomed])
    return runs[:-1], runs[-1]


def assert_serving(engine: Engine) -> None:
    stats = engine.statistics()
    assert engine.healthy
    assert stats.lanes_borrowed == 0 and stats.queued == 0
    assert stats.worker is not None and stats.worker.active == 0
    assert stats.late_events == 0


def poisoned_from(call: int) -> Callable[[Any, Any], Any]:
    """A logits processor whose output, from its `call`-th call on, fails when evaluated: the
    failure surfaces inside the batch's step, where no per-request guard can attribute it."""
    leaked: list[mx.array] = []

    def trace(x: mx.array) -> mx.array:
        leaked.append(x * 2)
        raise RuntimeError("stop tracing")

    with contextlib.suppress(RuntimeError):
        mx.compile(trace)(mx.array([1.0]))
    unevaluable = leaked[0]  # a tracer that escaped its compile: it has no primitive
    calls = 0

    def processor(tokens: Any, logits: Any) -> Any:
        nonlocal calls
        calls += 1
        return logits + unevaluable[0] * 0 if calls >= call else logits

    return processor


@pytest.mark.parametrize("seed", [-1, -(1 << 63), (1 << 64) - 1, 0])
async def test_any_64_bit_seed_samples_and_reproduces(engine: Engine, seed: int) -> None:
    def seeded() -> GenerationRequest:
        return request(
            engine,
            PROMPTS[1],
            max_tokens=12,
            ignore_eos=True,
            sampling=SamplingParams(temperature=1.5, seed=seed),
        )

    first, again = await collect(engine, seeded()), await collect(engine, seeded())
    assert first.final.finish_reason == "length"
    assert first.tokens == again.tokens
    assert_serving(engine)


async def test_signed_seeds_are_taken_modulo_2_to_the_64(engine: Engine) -> None:
    def seeded(seed: int) -> GenerationRequest:
        return request(
            engine,
            PROMPTS[0],
            max_tokens=12,
            ignore_eos=True,
            sampling=SamplingParams(temperature=1.5, seed=seed),
        )

    assert (await collect(engine, seeded(-1))).tokens == (
        await collect(engine, seeded((1 << 64) - 1))
    ).tokens
    with pytest.raises(ValueError, match="64-bit"):
        SamplingParams(seed=1 << 64)


@pytest.mark.parametrize("top_k", [2048, 4096, 1 << 63])
async def test_top_k_past_the_vocabulary_filters_nothing(engine: Engine, top_k: int) -> None:
    def sampled(k: int, seed: int | None = 3) -> GenerationRequest:
        return request(
            engine,
            PROMPTS[2],
            max_tokens=12,
            ignore_eos=True,
            sampling=SamplingParams(temperature=1.0, top_k=k, seed=seed),
        )

    assert (await collect(engine, sampled(top_k))).tokens == (
        await collect(engine, sampled(0))
    ).tokens
    after = await collect(engine, sampled(0, seed=None))  # unseeded sampling still works
    assert after.final.finish_reason == "length"
    assert_serving(engine)


async def test_sampling_never_touches_mlx_global_random_state(engine: Engine) -> None:
    before = np.array(mx.random.state[0])
    requests = [
        request(
            engine,
            p,
            max_tokens=8,
            ignore_eos=True,
            sampling=SamplingParams(temperature=1.0, top_p=0.8, min_p=0.05, top_k=40),
        )
        for p in PROMPTS
    ]
    runs = await collect_all(engine, requests)
    assert all(r.final.finish_reason == "length" for r in runs)
    assert np.array_equal(np.array(mx.random.state[0]), before)


async def test_a_failing_sampler_fails_only_its_request(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    healthy = batch(engine)
    solo = [await collect(engine, r) for r in healthy]
    real = _sampling.key_words

    def key_words(seed: int, draw: int) -> tuple[int, int]:
        if seed == 666 and draw >= 3:
            raise RuntimeError("sampler broke")
        return real(seed, draw)

    monkeypatch.setattr(_sampling, "key_words", key_words)
    doomed = request(
        engine,
        PROMPTS[4],
        max_tokens=16,
        ignore_eos=True,
        sampling=SamplingParams(temperature=1.0, seed=666),
    )
    runs, failed = await run_beside(engine, healthy, doomed)
    assert failed.final.finish_reason == "error" and "sampler broke" in (failed.final.error or "")
    assert [r.tokens for r in runs] == [s.tokens for s in solo]
    assert_serving(engine)


@pytest.mark.parametrize("where", ["processors", "prefix fetch"])
async def test_a_failure_while_admitting_fails_at_most_that_request(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    healthy = batch(engine)
    solo = [await collect(engine, r) for r in healthy]

    def breaks_for_poison(
        real: Callable[..., Any], key_of: Callable[..., Any]
    ) -> Callable[..., Any]:
        def wrapper(*args: Any, **keywords: Any) -> Any:
            if key_of(*args) == "poison":
                raise RuntimeError(f"{where} broke")
            return real(*args, **keywords)

        return wrapper

    if where == "processors":
        # The poisoned request is the one whose prompt length is 1.
        monkeypatch.setattr(
            _sequence,
            "make_request_processors",
            breaks_for_poison(
                _sequence.make_request_processors, lambda p, e, n, f: "poison" if n == 1 else None
            ),
        )
    else:
        monkeypatch.setattr(
            _prefix_cache.PrefixCache,
            "fetch",
            breaks_for_poison(
                _prefix_cache.PrefixCache.fetch, lambda self, namespace, prompt: namespace[1]
            ),
        )
    doomed = (
        GenerationRequest([5], max_tokens=8, cache_key="poison")
        if where == "processors"
        else request(engine, PROMPTS[4], max_tokens=8, cache_key="poison")
    )
    runs, failed = await run_beside(engine, healthy, doomed)
    if where == "processors":
        assert failed.final.finish_reason == "error" and failed.tokens == []
    else:  # the cache is an optimisation: its failure costs the request its reuse alone
        assert failed.final.finish_reason == "length" and len(failed.tokens) == 8
    assert [r.tokens for r in runs] == [s.tokens for s in solo]
    assert_serving(engine)


async def test_a_failing_handover_fails_only_the_lone_sequence(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    company = batch(engine)[1]
    alone = await collect(engine, company)

    def handover(self: Any) -> Any:
        raise RuntimeError("handover broke")

    monkeypatch.setattr(_solo_sequence.SoloSequence, "handover", handover)
    signal = CallSignal(trio.lowlevel.current_trio_token(), after_calls=3)
    lone = request(engine, PROMPTS[4], max_tokens=200, ignore_eos=True, logits_processors=[signal])
    results: dict[str, Run] = {}

    async def run_lone() -> None:
        results["lone"] = await collect(engine, lone)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_lone)
        await signal.event.wait()  # decoding alone, on the fast path
        results["company"] = await collect(engine, company)
    assert results["lone"].final.finish_reason == "error"
    assert results["company"].tokens == alone.tokens
    stats = engine.statistics().worker
    assert stats is not None and stats.handovers >= 1
    assert_serving(engine)


async def test_a_step_failure_nobody_can_attribute_fails_only_its_culprit(engine: Engine) -> None:
    """The poison shows only inside the batch's step, after the sequence's third token: the
    engine replays the batch, its suspects one at a time, and fails the one that fails
    alone, while the others go on with exactly their solo tokens."""
    healthy = batch(engine)
    solo = [await collect(engine, r) for r in healthy]
    doomed = request(
        engine,
        PROMPTS[4],
        max_tokens=16,
        ignore_eos=True,
        logits_processors=[poisoned_from(call=4)],
    )
    runs, failed = await run_beside(engine, healthy, doomed)
    assert failed.final.finish_reason == "error"
    assert [r.tokens for r in runs] == [s.tokens for s in solo]
    stats = engine.statistics().worker
    assert stats is not None
    assert stats.isolated_failures == 1
    assert stats.failed_steps >= 2 and stats.replays >= len(healthy)
    assert_serving(engine)
    assert (await collect(engine, healthy[0])).tokens == solo[0].tokens


async def test_a_poison_that_is_new_is_failed_without_disturbing_the_batch(engine: Engine) -> None:
    healthy = batch(engine, max_tokens=40)
    solo = [await collect(engine, r) for r in healthy]
    signal = CallSignal(trio.lowlevel.current_trio_token(), after_calls=6)
    healthy[0] = GenerationRequest(
        healthy[0].prompt_tokens,
        40,
        sampling=healthy[0].sampling,
        ignore_eos=True,
        logits_processors=[signal],
    )
    results: list[Run] = []

    async def run_batch() -> None:
        results.extend(await collect_all(engine, healthy))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_batch)
        await signal.event.wait()  # the batch is decoding: the poison arrives as a newcomer
        failed = await collect(
            engine,
            request(engine, PROMPTS[4], max_tokens=8, logits_processors=[poisoned_from(call=1)]),
        )
    assert failed.final.finish_reason == "error" and failed.tokens == []
    assert [r.tokens for r in results] == [s.tokens for s in solo]
    stats = engine.statistics().worker
    assert stats is not None and stats.isolated_failures == 1
    assert_serving(engine)


async def test_a_model_that_fails_on_its_own_ends_the_engine(
    engine_config: EngineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failures that no suspect explains (the model fails even alone) are the engine's."""
    config = EngineConfig(engine_config.model, max_concurrency=2, max_consecutive_step_failures=2)
    async with open_engine(config) as engine:
        first = await collect(engine, request(engine, PROMPTS[0], max_tokens=4))
        assert first.final.finish_reason in ("stop", "length")

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("device lost")

        model = engine_model(engine)
        # The whole model and its body (a prefill chunk runs the body alone: _first_tokens).
        monkeypatch.setattr(type(model), "__call__", broken)
        monkeypatch.setattr(type(model.model), "__call__", broken)
        finals = [
            (await collect(engine, request(engine, p, max_tokens=4))).final for p in PROMPTS[:2]
        ]
        assert [f.finish_reason for f in finals] == ["error", "error"]
        assert not engine.healthy and engine.statistics().state == "failed"
        assert engine.statistics().lanes_borrowed == 0


def engine_model(engine: Engine) -> Any:
    worker = engine._worker
    assert worker is not None and worker._runner is not None
    return worker._runner.model.model


async def test_a_constrained_sequence_is_replayed_with_its_grammar_in_step(engine: Engine) -> None:
    """The step that fails has already fed the grammar a token nobody will see: the replay
    rolls the matcher back, and the JSON comes out as it does alone."""
    from mlx_nursery.generation._structured import Grammars

    tokenizer = engine.model.tokenizer
    grammars = Grammars(tokenizer, len(tokenizer.get_vocab()))

    def constrained() -> GenerationRequest:
        schema = {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
            "required": ["n", "s"],
        }
        return request(
            engine,
            PROMPTS[0],
            max_tokens=40,
            logits_processors=[grammars.json_processor(schema, "x")],
        )

    alone = await collect(engine, constrained())
    runs, failed = await run_beside(
        engine,
        [constrained(), *batch(engine)[1:]],
        request(
            engine,
            PROMPTS[4],
            max_tokens=16,
            ignore_eos=True,
            logits_processors=[poisoned_from(call=3)],
        ),
    )
    assert failed.final.finish_reason == "error"
    assert runs[0].final.finish_reason == "length", runs[0].final
    assert runs[0].tokens == alone.tokens
    stats = engine.statistics().worker
    assert stats is not None and stats.replays >= 1


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=1e-300, seed=1),
        SamplingParams(temperature=1.0, top_p=1e-300, seed=1),
    ],
    ids=["tiny temperature", "tiny top_p"],
)
async def test_vanishing_temperature_or_top_p_is_argmax(
    engine: Engine, sampling: SamplingParams
) -> None:
    greedy = await collect(engine, request(engine, PROMPTS[3], max_tokens=12, ignore_eos=True))
    vanishing = await collect(
        engine, request(engine, PROMPTS[3], max_tokens=12, ignore_eos=True, sampling=sampling)
    )
    assert vanishing.tokens == greedy.tokens
    assert_serving(engine)
