"""The KV memory budget (`engine/_memory.py`): the engine holds an arrival back, or takes the
newest sequence out of the batch and replays it later, rather than let the batch's KV
outgrow the budget; and what it serves is what it would serve without the budget.

The tiny model's KV costs 512 bytes a token (2 layers x keys and values x 2 heads x 16
dimensions x 4 bytes); mlx-lm's batch holds rows x longest, in steps of 256 tokens.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
import trio
from mlx_lm.utils import load

from mlx_nursery.engine import EngineConfig, SamplingParams, kv_budget, open_engine
from mlx_nursery.engine._memory import (
    BUFFER_CACHE_FRACTION,
    KVBudget,
    bound_buffer_cache,
    derive_kv_bytes,
    device_memory,
    kv_bytes_per_token,
)
from mlx_nursery.models import load_model, model_facts
from mlx_nursery.tools import make_model
from tests.helpers import CallSignal, Run, collect, request

TINY_BYTES_PER_TOKEN = 512


def test_a_batch_holds_rows_times_its_longest_sequence_in_steps() -> None:
    assert KVBudget.footprint([]) == 0
    assert KVBudget.footprint([10]) == 256
    assert KVBudget.footprint([10, 255]) == 2 * 256  # 255 + 1 ahead fits one step
    assert KVBudget.footprint([10, 256]) == 2 * 512
    assert KVBudget.footprint([5, 5, 5, 2000]) == 4 * 2048  # one long row lengthens all


def test_mlx_buffer_cache_is_bounded_on_cuda_only() -> None:
    """On CUDA MLX's cache of freed buffers gets a share of the device's memory; elsewhere
    (and with the memory unknown) MLX's own limit stays."""
    before = mx.set_cache_limit(2**40)
    try:
        assert bound_buffer_cache(False, 10**9) is None
        assert bound_buffer_cache(True, None) is None
        assert mx.set_cache_limit(2**40) == 2**40  # untouched by either
        assert bound_buffer_cache(True, 10**9) == int(10**9 * BUFFER_CACHE_FRACTION)
        assert mx.set_cache_limit(2**40) == int(10**9 * BUFFER_CACHE_FRACTION)
    finally:
        mx.set_cache_limit(before)


def test_the_budget_admits_with_room_to_grow_and_never_refuses_a_lone_sequence() -> None:
    budget = KVBudget(1024)
    assert budget.fits([10, 300])
    assert not budget.fits([10, 300], growth=256)
    assert budget.fits([10, 200], growth=256)
    assert budget.fits([5000])  # alone: the served context is what bounds it
    assert not budget.fits([10, 600])
    assert KVBudget(None).fits([10**6, 10**6])
    assert budget.served_context(4096) == 768
    assert budget.served_context(500) == 500
    assert KVBudget(None).served_context(4096) == 4096


def test_the_default_budget_is_a_share_of_device_memory_less_weights_and_prefix_cache() -> None:
    assert device_memory({"max_recommended_working_set_size": 100, "memory_size": 200}) == 100
    assert device_memory({"total_memory": 300}) == 300
    assert device_memory({"device_name": "cpu"}) is not None  # the machine's RAM
    assert derive_kv_bytes(1000, weights=300, prompt_cache_bytes=100) == 400
    assert derive_kv_bytes(1000, weights=900, prompt_cache_bytes=100) == 0
    assert derive_kv_bytes(None, weights=1, prompt_cache_bytes=1) is None


def test_a_tokens_kv_cost_is_measured_on_the_model(tiny_model: Path) -> None:
    model = load(str(tiny_model))[0]
    assert kv_bytes_per_token(model) == TINY_BYTES_PER_TOKEN


@pytest.mark.parametrize(("preset", "dtype"), [("tiny", "bfloat16"), ("tiny-vlm", "float32")])
def test_a_tokens_kv_cost_read_before_the_load_is_the_one_measured_after(
    tmp_path: Path, tiny_model: Path, preset: str, dtype: str
) -> None:
    """The model list tells the served context before a load from the model's files
    (`ModelFacts.kv_layout`): it must cost a token what the loaded model measures."""
    other = make_model(tmp_path / preset, preset, dtype=dtype, seed=0)
    for path in (tiny_model, other):
        layout = model_facts(path).kv_layout
        assert layout is not None
        assert layout.bytes_per_token() == kv_bytes_per_token(load_model(path).model)


def test_the_budget_stops_at_what_the_sequences_can_hold() -> None:
    """The KV budget counts no more than `max_sequences` sequences as long as the context
    can use, each a step ahead (memory past it is never used), and no less than its floor."""
    most = kv_budget(1 << 40, TINY_BYTES_PER_TOKEN, 4096, max_sequences=8)
    assert most.tokens == 8 * KVBudget.footprint([4096 + 256]) == 8 * 4608
    assert most.served_context(4096) == 4096
    assert most.fits([4096] * 8, growth=256)  # the engine's admission never waits on the cap
    assert kv_budget(600 * 512, 512, 4096, 8).served_context(4096) == 600 - 256
    assert kv_budget(10, 512, 4096, 8).tokens == 512  # the floor: one step of context


async def test_the_served_context_is_capped_by_the_kv_budget(tiny_model: Path) -> None:
    config = EngineConfig(tiny_model, kv_cache_bytes=1024 * TINY_BYTES_PER_TOKEN)
    async with open_engine(config) as engine:
        assert engine.model.context_length == 1024 - 256  # the model's own is 4096
        assert engine.model.kv_budget_tokens == 1024


async def test_a_draft_models_kv_is_counted_in_the_budget(tiny_model: Path) -> None:
    """With a draft model (here the served model itself: the same KV a token), every running
    token holds the draft's KV too: the same bytes hold half the tokens."""
    from mlx_nursery.engine import Speculation

    speculation = Speculation("draft", draft_model=str(tiny_model))
    config = EngineConfig(
        tiny_model, kv_cache_bytes=2048 * TINY_BYTES_PER_TOKEN, speculation=speculation
    )
    async with open_engine(config) as engine:
        assert engine.model.kv_budget_tokens == 1024
        assert engine.model.kv_bytes_per_token == TINY_BYTES_PER_TOKEN  # a cached prefix's


async def test_an_arrival_that_cannot_fit_beside_the_batch_waits_and_is_served_unchanged(
    tiny_model: Path,
) -> None:
    """A budget of 512 tokens: two rows never fit with room to grow, so the second request
    waits until the first ends, then gives the tokens it gives alone."""
    config = EngineConfig(
        tiny_model, max_concurrency=4, prompt_cache_bytes=0, kv_cache_bytes=512 * 512
    )
    async with open_engine(config) as engine:
        first = request(engine, "The first request of two.", max_tokens=40)
        second = request(
            engine,
            "The second one, sampled.",
            max_tokens=30,
            sampling=SamplingParams(temperature=0.9, seed=11),
        )
        alone = [await collect(engine, first), await collect(engine, second)]
        runs: list[Run] = []

        async def run_first() -> None:
            runs.append(await collect(engine, first))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_first)
            together = await collect(engine, second)
        stats = engine.statistics()
        assert stats.worker is not None
        assert stats.worker.held_for_memory >= 1
        assert stats.worker.preemptions == 0
        assert [runs[0].tokens, together.tokens] == [alone[0].tokens, alone[1].tokens]
        assert stats.lanes_borrowed == 0


@pytest.mark.parametrize(
    "sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=3)]
)
async def test_the_newest_sequence_is_preempted_when_the_batch_would_outgrow_the_budget(
    tiny_model: Path, sampling: SamplingParams
) -> None:
    """A budget of 1,024 tokens: a second sequence joins while the first is short (two rows
    of up to 511 tokens fit), and is taken out when the longer reaches 511; it is replayed
    once the first ends and gives exactly the tokens it gives alone."""
    config = EngineConfig(
        tiny_model, max_concurrency=4, prompt_cache_bytes=0, kv_cache_bytes=1024 * 512
    )
    async with open_engine(config) as engine:
        long = request(engine, "A long answer.", max_tokens=600)
        joiner = request(
            engine, "Another that joins.", max_tokens=600, sampling=sampling, ignore_eos=True
        )
        alone = [await collect(engine, long), await collect(engine, joiner)]

        signal = CallSignal(trio.lowlevel.current_trio_token(), after_calls=5)
        long_signalled = request(
            engine, "A long answer.", max_tokens=600, logits_processors=[signal]
        )
        runs: list[Run] = []

        async def run_long() -> None:
            runs.append(await collect(engine, long_signalled))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_long)
            await signal.event.wait()  # the long one is running, 5 tokens in
            joined = await collect(engine, joiner)
        stats = engine.statistics()
        assert stats.worker is not None
        assert stats.worker.preemptions == 1
        assert runs[0].tokens == alone[0].tokens
        assert joined.tokens == alone[1].tokens
        assert joined.final.usage is not None and joined.final.usage.completion_tokens == 600
        assert stats.lanes_borrowed == 0


async def test_a_waiting_request_can_be_cancelled_and_frees_its_lane(tiny_model: Path) -> None:
    config = EngineConfig(
        tiny_model, max_concurrency=4, prompt_cache_bytes=0, kv_cache_bytes=512 * 512
    )
    async with open_engine(config) as engine:
        token = trio.lowlevel.current_trio_token()
        started = CallSignal(token, after_calls=3)
        later = CallSignal(token, after_calls=10**9)
        first = request(engine, "Runs on.", max_tokens=200, logits_processors=[started, later])
        runs: list[Run] = []

        async def run_first() -> None:
            runs.append(await collect(engine, first))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_first)
            await started.event.wait()
            async with engine.generate(request(engine, "Waits, then leaves.", max_tokens=20)):
                later.arm(3)
                await later.event.wait()  # steps since the submission: the engine holds it
                worker = engine.statistics().worker
                assert worker is not None and worker.held_for_memory == 1
            # leaving the block unread cancels it, while it waits for memory
        stats = engine.statistics()
        assert len(runs[0].tokens) == 200
        assert stats.lanes_borrowed == 0
        assert stats.cancellations.confirmed == 1
