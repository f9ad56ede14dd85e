"""Prefill chunks sized by a time budget (`engine/_chunking.py`): the policy on synthetic
measurements, and the engine shrinking a prompt's chunks while another stream decodes.

No wall time is asserted: the sizer is fed durations, and the engine's behaviour is read
from its statistics (chunk sizes beside decoding), which depend only on the budget's extremes.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import trio

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.engine._backend import on_cuda
from mlx_nursery.engine._chunking import (
    CHUNK_TOKENS,
    CPU_BUDGET_MS,
    CUDA_CHUNK_TOKENS,
    GPU_BUDGET_MS,
    MIN_CHUNK_TOKENS,
    ChunkSizer,
    GapMeter,
    budget_ms,
    chunk_sizes,
)

GREEDY = SamplingParams(temperature=0.0)


def test_chunk_sizes_are_powers_of_two_from_the_floor_then_the_step_size() -> None:
    assert chunk_sizes(512) == (16, 32, 64, 128, 256, 512)
    assert chunk_sizes(100) == (16, 32, 64, 100)
    assert chunk_sizes(16) == (16,)
    assert chunk_sizes(5) == (5,)  # a step below the floor is the only size


def test_the_configured_budget_zero_is_none_and_unset_is_the_backends() -> None:
    assert budget_ms(0.0) is None
    assert budget_ms(120.0) == 120.0
    on_cpu = mx.default_device().type == mx.cpu
    assert budget_ms(None) == (CPU_BUDGET_MS if on_cpu else GPU_BUDGET_MS)


def test_the_configured_chunk_is_kept_and_unset_is_the_backends(tiny_model: Path) -> None:
    """`prefill_step_size` unset: 1,024 tokens on CUDA, 512 elsewhere (decided by
    measurement on an H200; the CPU and Metal keep the shorter chunk a cancel waits for)."""
    assert CUDA_CHUNK_TOKENS > CHUNK_TOKENS
    assert EngineConfig(tiny_model).chunk_tokens() == (
        CUDA_CHUNK_TOKENS if on_cuda() else CHUNK_TOKENS
    )
    assert EngineConfig(tiny_model, prefill_step_size=48).chunk_tokens() == 48


def test_a_prompt_prefilled_while_nothing_decodes_gets_the_largest_chunk() -> None:
    sizer = ChunkSizer(512, budget_ms=1.0)
    sizer.observe(16, 100.0)  # a token costs seconds: beside decoding, the floor
    assert sizer.size(1, decoding=True) == MIN_CHUNK_TOKENS
    assert sizer.size(8, decoding=False) == 512
    assert sizer.beside_decode == {MIN_CHUNK_TOKENS: 1}  # only chunks beside decoding count


def test_before_any_measurement_a_chunk_beside_decoding_gets_the_floor() -> None:
    sizer = ChunkSizer(512, budget_ms=250.0)
    assert sizer.seconds_per_token is None
    assert sizer.size(1, decoding=True) == 16


def test_the_size_is_the_largest_whose_predicted_time_fits_the_budget_per_row() -> None:
    sizer = ChunkSizer(512, budget_ms=250.0)
    sizer.observe(512, 2.56)  # 5 ms a token
    assert sizer.size(1, decoding=True) == 32  # 50 tokens fit: 32, not 64
    assert sizer.size(2, decoding=True) == 16  # 25 per row
    assert sizer.size(8, decoding=True) == 16  # 6 per row fit: the floor, over the budget
    fast = ChunkSizer(512, budget_ms=250.0)
    fast.observe(512, 0.0512)  # 0.1 ms a token: 2,500 fit
    assert fast.size(1, decoding=True) == 512
    assert fast.size(8, decoding=True) == 256  # 312 per row


def test_no_budget_keeps_the_largest_chunk_and_still_measures() -> None:
    sizer = ChunkSizer(64, budget_ms=None)
    sizer.observe(64, 64.0)
    assert sizer.size(4, decoding=True) == 64
    assert sizer.seconds_per_token == 1.0
    assert sizer.beside_decode == {64: 1}


def test_the_average_weighs_chunks_by_their_tokens() -> None:
    """A short chunk whose time is mostly overhead barely moves the cost per token."""
    sizer = ChunkSizer(512, budget_ms=100.0)
    sizer.observe(1000, 1.0)  # 1 ms a token
    sizer.observe(2, 0.2)  # a 2-token tail, 100 ms a token alone
    per_token = sizer.seconds_per_token
    assert per_token is not None and 0.001 < per_token < 0.002
    sizer.observe(1000, 3.0)
    sizer.observe(1000, 3.0)
    sizer.observe(1000, 3.0)  # the cost tripled: the average follows within a few chunks
    per_token = sizer.seconds_per_token
    assert per_token is not None and 0.0024 < per_token < 0.003


def test_fed_a_backends_costs_the_chunks_settle_within_the_budget_and_near_it() -> None:
    """A backend whose chunk costs a fixed overhead plus a price per token and row: from the
    floor, the sizer climbs to the largest size that fits and stays there. No chunk takes
    more than the budget, and the settled ones more than half of it (sizes double)."""
    budget = 0.2

    def cost(rows: int, size: int) -> float:
        return 0.01 + rows * size * 0.001

    for rows, settled in ((1, 128), (2, 64), (4, 32)):
        sizer = ChunkSizer(512, budget_ms=budget * 1000)
        sizes = []
        for _ in range(12):
            size = sizer.size(rows, decoding=True)
            sizes.append(size)
            sizer.observe(rows * size, cost(rows, size))
        assert sizes[0] == 16
        assert sizes[-4:] == [settled] * 4, sizes
        assert all(cost(rows, size) <= budget for size in sizes), sizes
        assert budget / 2 < cost(rows, settled) <= budget < cost(rows, 2 * settled)


def test_a_chunk_beside_decoding_costs_the_excess_of_the_gaps_it_was_in_flight_for() -> None:
    """Fed the times decode steps' tokens were read: the gaps without a chunk set the
    average; a chunk launched after one step has landed two steps later, and is observed
    with the excess of both gaps over that average; a pause forgets what is in flight."""
    sizer = ChunkSizer(512, budget_ms=None)
    meter = GapMeter(sizer)
    meter.decoded(0.0)
    meter.decoded(0.010)
    meter.decoded(0.020)
    assert meter.base_seconds == 0.010
    meter.launched(100)
    meter.decoded(0.035)  # in flight: 5 ms over the average
    assert sizer.seconds_per_token is None  # not landed yet: nothing observed
    meter.decoded(0.055)  # landed: 10 ms more
    assert sizer.seconds_per_token == 0.015 / 100
    assert meter.base_seconds == 0.010  # gaps with a chunk in flight leave the average

    meter.launched(50)
    meter.paused()  # no decode step: the chunk can no longer be timed
    meter.decoded(1.0)
    meter.decoded(1.1)  # a plain gap again, not the chunk's
    assert sizer.seconds_per_token == 0.015 / 100
    assert meter.base_seconds is not None and meter.base_seconds > 0.010


def test_before_any_plain_gap_a_chunk_is_charged_the_whole_gap() -> None:
    sizer = ChunkSizer(512, budget_ms=None)
    meter = GapMeter(sizer)
    meter.decoded(0.0)
    meter.launched(10)
    meter.decoded(0.004)
    meter.decoded(0.010)
    assert sizer.seconds_per_token == 0.010 / 10


def _request(prompt: list[int], max_tokens: int) -> GenerationRequest:
    return GenerationRequest(prompt, max_tokens=max_tokens, sampling=GREEDY, ignore_eos=True)


async def _prefill_beside_a_stream(engine: Engine, prompt_tokens: int) -> dict[int, int]:
    """Start a stream, and once it decodes, prefill a long prompt beside it (cancelling the
    stream when the prompt has its first tokens); return the chunks run beside decoding."""
    async with trio.open_nursery() as nursery:
        decoding = trio.Event()

        async def stream() -> None:
            async with engine.generate(_request([3, 4, 5], max_tokens=4000)) as events:
                async for _ in events:
                    decoding.set()

        nursery.start_soon(stream)
        await decoding.wait()
        long_prompt = [(7 * i) % 500 + 10 for i in range(prompt_tokens)]
        async with engine.generate(_request(long_prompt, max_tokens=2)) as events:
            finals = [event async for event in events if event.is_final]
        assert finals[0].finish_reason == "length"
        nursery.cancel_scope.cancel()
    stats = engine.statistics().worker
    assert stats is not None
    return dict(stats.prefill_chunks_beside_decode)


async def test_a_tiny_budget_prefills_beside_a_decoding_stream_in_the_smallest_chunks(
    tiny_model: Path,
) -> None:
    """With a budget no chunk can meet, a 200-token prompt (199 prefilled, the last runs in
    its first decode step) goes in 13 chunks of 16 tokens, each in a step that decoded the
    running stream; with no budget, in 4 chunks of the step size, 64."""
    common = {"max_concurrency": 2, "prompt_cache_bytes": 0, "prefill_step_size": 64}
    tiny = EngineConfig(tiny_model, prefill_chunk_ms=1e-6, warmup=False, **common)
    async with open_engine(tiny) as engine:
        assert await _prefill_beside_a_stream(engine, 200) == {16: 13}
    off = EngineConfig(tiny_model, prefill_chunk_ms=0, warmup=False, **common)
    async with open_engine(off) as engine:
        assert await _prefill_beside_a_stream(engine, 200) == {64: 4}
