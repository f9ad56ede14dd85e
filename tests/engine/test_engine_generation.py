"""Generation through the real engine on a factory-made model."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import pytest
import trio

from mlx_nursery.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    PromptTooLong,
    SamplingParams,
    open_engine,
)
from tests.helpers import collect, collect_all, raising_processor, request

PROMPTS = [
    "What is the capital of France?",
    "hello world",
    "Write a function that returns the answer.",
    "list of numbers: 1 2 3",
    "The weather today is",
    "please call the tool with arguments",
]


async def test_stream_ends_with_usage_and_deltas_rebuild_the_text(engine: Engine) -> None:
    run = await collect(engine, request(engine, PROMPTS[0], max_tokens=16, ignore_eos=True))
    assert run.final.finish_reason == "length"
    assert run.final.usage is not None
    assert run.final.usage.completion_tokens == 16 == len(run.tokens)
    assert run.final.usage.prompt_tokens == len(engine.model.tokenizer.encode(PROMPTS[0]))
    assert run.text == engine.model.tokenizer.decode(run.tokens)
    assert all(not e.is_final for e in run.events[:-1])


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_p=0.9, seed=7)],
    ids=["greedy", "seeded"],
)
async def test_concurrent_streams_match_their_solo_runs(
    engine: Engine, sampling: SamplingParams
) -> None:
    requests = [
        request(engine, p, max_tokens=20, sampling=sampling, ignore_eos=True) for p in PROMPTS
    ]
    solo = [await collect(engine, r) for r in requests]
    together = await collect_all(engine, requests)
    assert [t.tokens for t in together] == [s.tokens for s in solo]
    assert len({tuple(s.tokens) for s in solo}) > 1, "prompts should not all give the same output"


async def test_seed_reproduces_and_differs_by_seed(engine: Engine) -> None:
    def seeded(seed: int) -> GenerationRequest:
        return request(
            engine,
            PROMPTS[1],
            max_tokens=30,
            ignore_eos=True,
            sampling=SamplingParams(temperature=1.5, seed=seed),
        )

    first, again, other = [await collect(engine, seeded(s)) for s in (1, 1, 2)]
    assert first.tokens == again.tokens
    assert first.tokens != other.tokens


async def test_stop_token_ends_the_stream_without_its_text(engine: Engine) -> None:
    probe = await collect(engine, request(engine, PROMPTS[2], max_tokens=12, ignore_eos=True))
    stop_at = probe.tokens[5]
    index = probe.tokens.index(stop_at)
    run = await collect(
        engine,
        request(engine, PROMPTS[2], max_tokens=12, ignore_eos=True, stop_token_ids={stop_at}),
    )
    assert run.final.finish_reason == "stop"
    assert run.final.token_id is None
    assert run.tokens == probe.tokens[:index]
    assert run.final.usage is not None and run.final.usage.completion_tokens == index + 1


async def test_logit_bias_forces_a_token(engine: Engine) -> None:
    forced = engine.model.tokenizer.encode(" Paris")[0]
    run = await collect(
        engine,
        request(
            engine,
            PROMPTS[0],
            max_tokens=5,
            ignore_eos=True,
            sampling=SamplingParams(temperature=0.0, logit_bias={forced: 1000.0}),
        ),
    )
    assert run.tokens == [forced] * 5


async def test_logprobs_report_the_sampled_token_and_sorted_top_k(engine: Engine) -> None:
    run = await collect(
        engine, request(engine, PROMPTS[3], max_tokens=6, ignore_eos=True, logprobs=3)
    )
    for event in run.events:
        if event.token_id is None:
            continue
        assert event.logprob is not None
        assert event.logprob.token_id == event.token_id
        assert event.logprob.logprob <= 0.0
        values = [lp for _, lp in event.logprob.top]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        # greedy: the sampled token is the most likely one
        assert event.logprob.top[0][0] == event.token_id
        assert math.isclose(event.logprob.top[0][1], event.logprob.logprob, rel_tol=1e-5)


async def test_failing_logits_processor_fails_only_its_request(engine: Engine) -> None:
    healthy_request = request(engine, PROMPTS[4], max_tokens=20, ignore_eos=True)
    solo = await collect(engine, healthy_request)
    broken = request(
        engine,
        PROMPTS[5],
        max_tokens=20,
        ignore_eos=True,
        logits_processors=[raising_processor(3, lambda: ValueError("boom"))],
    )
    results = {}

    async def run(name: str, r: GenerationRequest) -> None:
        results[name] = await collect(engine, r)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "broken", broken)
        nursery.start_soon(run, "healthy", healthy_request)

    assert results["broken"].final.finish_reason == "error"
    assert "boom" in (results["broken"].final.error or "")
    assert len(results["broken"].tokens) == 2  # the third step's token was never emitted
    assert results["healthy"].tokens == solo.tokens
    assert engine.healthy
    assert (await collect(engine, healthy_request)).tokens == solo.tokens


async def test_prompt_longer_than_context_is_refused(engine: Engine) -> None:
    context = engine.model.context_length
    with pytest.raises(PromptTooLong) as info:
        async with engine.generate(GenerationRequest([1] * (context - 4), max_tokens=8)):
            pass
    assert info.value.context_length == context
    assert engine.limiter.borrowed_tokens == 0


async def test_strict_serialization_gives_the_same_tokens(
    engine_config: EngineConfig, engine: Engine
) -> None:
    requests = [request(engine, p, max_tokens=12, ignore_eos=True) for p in PROMPTS[:3]]
    batched = [(await collect(engine, r)).tokens for r in requests]
    serial_config = EngineConfig(engine_config.model, max_concurrency=1)
    async with open_engine(serial_config) as serial:
        results = await collect_all(serial, requests)
    assert [r.tokens for r in results] == batched


async def test_statistics_count_prefill_forwards_and_their_distinct_shapes(
    tiny_model: Path,
) -> None:
    """A lone prompt is prefilled in one forward, or in chunks of `prefill_step_size`; the
    engine counts the forwards and the distinct (batch, query, key) shapes among them."""
    config = EngineConfig(tiny_model, max_concurrency=2, prompt_cache_bytes=0, prefill_step_size=64)
    async with open_engine(config) as engine:
        for prompt in ([5] * 10, [6] * 10, [7] * 20, [8] * 100):
            run = await collect(engine, GenerationRequest(prompt, max_tokens=2, ignore_eos=True))
            assert run.final.finish_reason == "length"
        stats = engine.statistics().worker
    assert stats is not None
    # 10, 10 again (a seen shape), 20, then 100 as a 64-token chunk and the 36 after it.
    assert (stats.prefill_forwards, stats.prefill_shapes) == (5, 4)


@pytest.mark.parametrize("cudnn", [False, True])
async def test_the_engine_sets_mlx_cuda_attention_switch_before_loading(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, cudnn: bool
) -> None:
    monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", "unset by the test")
    async with open_engine(EngineConfig(tiny_model, cudnn_attention=cudnn)):
        assert os.environ["MLX_CUDA_USE_CUDNN_SDPA"] == ("1" if cudnn else "0")


async def test_fused_weights_change_no_greedy_token(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An engine on fused projections (the default) answers greedy requests, a lone one
    (the fast path) and several at once (the batch), with the tokens of one that keeps the
    checkpoint's projections apart (`fuse_weights=False`), which fuses nothing."""
    runs: dict[bool, list[list[int]]] = {}
    for fuse in (True, False):
        caplog.clear()
        config = EngineConfig(tiny_model, fuse_weights=fuse, warmup=False)
        with caplog.at_level(logging.INFO, logger="mlx_nursery.models"):
            async with open_engine(config) as engine:
                requests = [request(engine, p, max_tokens=12, ignore_eos=True) for p in PROMPTS]
                solo = await collect(engine, requests[0])
                together = await collect_all(engine, requests)
        runs[fuse] = [solo.tokens, *(run.tokens for run in together)]
        fused_logs = [r for r in caplog.records if "fused projections" in r.message]
        assert len(fused_logs) == (1 if fuse else 0)
    assert runs[True] == runs[False]
    assert len({tuple(tokens) for tokens in runs[True]}) > 2


async def test_the_startup_warm_up_runs_and_changes_no_answer(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The warm-up (on by default) runs the model before the engine reports ready, and
    leaves nothing behind that an answer could depend on: greedy and seeded answers are
    those of an engine that skipped it."""
    requests = [
        {"max_tokens": 16},
        {"max_tokens": 16, "sampling": SamplingParams(temperature=0.9, seed=21)},
    ]

    async def answers(config: EngineConfig) -> list[list[int]]:
        async with open_engine(config) as engine:
            return [
                (await collect(engine, request(engine, "Warm or cold?", **kwargs))).tokens
                for kwargs in requests
            ]

    with caplog.at_level(logging.INFO, logger="mlx_nursery.engine"):
        warm = await answers(EngineConfig(tiny_model, prompt_cache_bytes=0))
    assert any("warm-up done" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mlx_nursery.engine"):
        cold = await answers(EngineConfig(tiny_model, prompt_cache_bytes=0, warmup=False))
    assert not any("warm-up" in r.getMessage() for r in caplog.records)
    assert warm == cold
