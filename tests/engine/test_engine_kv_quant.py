"""The quantized KV cache (`--kv-bits`, engine/_kv_quant.py): batched, lone and cached
sequences all hold quantized KV; they agree with each other; 8 bits stays close to the
unquantized cache; the KV budget counts quantized bytes.

The `small` preset's KV head dimension (32) is the smallest that MLX quantizes (group size
32); the `tiny` preset's (16) cannot be, which the engine says at load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import pytest
import trio

from mlx_nursery.engine import Engine, EngineConfig, SamplingParams, Speculation, open_engine
from mlx_nursery.engine._kv_quant import (
    KVQuantization,
    KVQuantizationError,
    QuantizedBatchKVCache,
    QuantizedKVRow,
    cache_factory,
)
from mlx_nursery.engine._memory import kv_bytes_per_token
from mlx_nursery.models import load_model, model_facts
from tests.helpers import Run, collect, collect_all, request

GROUP = 32
HEADS, DIM = 4, 32  # the small preset's KV heads and head dimension
LAYERS = 4
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "hello",
    "A much longer prompt, so that the batch's rows are left-padded to it. " * 6,
]
SEEDED = SamplingParams(temperature=1.0, seed=11)
GREEDY = SamplingParams(temperature=0.0)


def _config(model: Path, bits: int | None, **kwargs: Any) -> EngineConfig:
    kwargs.setdefault("warmup", False)
    return EngineConfig(
        model,
        max_concurrency=8,
        prefill_step_size=32,
        kv_bits=bits,
        kv_group_size=GROUP,
        **kwargs,
    )


def _requests(engine: Engine, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("max_tokens", 6)
    kwargs.setdefault("sampling", GREEDY)
    return [request(engine, text, logprobs=0, ignore_eos=True, **kwargs) for text in PROMPTS]


def _logprobs(run: Run) -> list[float]:
    return [e.logprob.logprob for e in run.events if e.logprob is not None]


async def _lone_then_batched(engine: Engine) -> tuple[list[Run], list[Run]]:
    lone = [await collect(engine, r) for r in _requests(engine)]
    batched = await collect_all(engine, _requests(engine))
    return lone, batched


# --- the batch cache's operations, on arrays alone --------------------------------------


def _row(length: int, seed: int) -> tuple[QuantizedKVRow, mx.array]:
    """A quantized row of `length` random keys (values the same), and those keys."""
    keys = mx.random.normal((1, HEADS, length, DIM), key=mx.random.key(seed))
    row = QuantizedKVRow(GROUP, 4)
    row.update_and_fetch(keys, keys)
    return row, keys


def _dequantized(parts: tuple[mx.array, ...]) -> mx.array:
    return mx.dequantize(*parts, group_size=GROUP, bits=4)


def _same_row(cache: QuantizedBatchKVCache, index: int, row: QuantizedKVRow) -> bool:
    extracted = cache.extract(index)
    if extracted.offset != row.offset:
        return False
    mine = _dequantized(extracted.keys)
    theirs = _dequantized(tuple(p[..., : row.offset, :] for p in row.keys))
    return bool(mx.array_equal(mine, theirs))


def test_the_batch_cache_keeps_each_rows_quantized_kv_through_merge_extend_and_filter() -> None:
    rows = [_row(n, seed) for seed, n in enumerate((5, 300, 17))]
    batch = QuantizedBatchKVCache.merge([row for row, _ in rows])
    assert batch.bits == 4 and batch.group_size == GROUP
    assert batch.keys is not None and batch.keys[0].dtype == mx.uint32  # packed, not float
    assert batch.left_padding.tolist() == [295, 0, 283]
    assert all(_same_row(batch, i, row) for i, (row, _) in enumerate(rows))

    # One decode step: each row gets its own new key, after its own history.
    step = mx.random.normal((3, HEADS, 1, DIM), key=mx.random.key(9))
    fetched_keys, _ = batch.update_and_fetch(step, step)
    # What some models (afm7, gemma3n) read a shared cache through: the same filled parts.
    held_keys, _ = batch.keys_and_values()
    assert all(a.shape == b.shape for a, b in zip(held_keys, fetched_keys, strict=True))
    assert held_keys[0].shape[2] == 301  # the longest row (300) and the step
    assert all(bool(mx.array_equal(a, b)) for a, b in zip(held_keys, fetched_keys, strict=True))
    for i, (row, _) in enumerate(rows):
        row.update_and_fetch(step[i : i + 1], step[i : i + 1])
        assert _same_row(batch, i, row)

    newcomer, _ = _row(40, seed=7)
    batch.extend(QuantizedBatchKVCache.merge([newcomer]))
    assert _same_row(batch, 3, newcomer) and _same_row(batch, 0, rows[0][0])

    batch.filter(mx.array([0, 3]))  # the long row leaves: the shared padding goes with it
    assert batch.left_padding.tolist() == [34, 0] and batch.size() == 40
    assert _same_row(batch, 0, rows[0][0]) and _same_row(batch, 1, newcomer)
    mask = batch.make_mask(1)
    assert mask.shape == (2, 1, 1, 41)  # the keys held and the one being added
    assert not bool(mask[0, 0, 0, 33]) and bool(mask[0, 0, 0, 34])  # padding is masked


def test_a_padded_chunk_moves_each_rows_quantized_kv_to_end_at_the_index() -> None:
    """A chunk of unequal lengths is right-padded; `finalize` moves each row's quantized
    tokens right by its padding, as mlx-lm's roll did: every row then extracts as the same
    row that took its chunk alone."""
    rows = [_row(n, seed) for seed, n in enumerate((5, 30, 17))]
    batch = QuantizedBatchKVCache.merge([row for row, _ in rows])
    chunk = [3, 1, 2]
    longest = max(chunk)
    step = mx.random.normal((3, HEADS, longest, DIM), key=mx.random.key(21))
    batch.prepare(lengths=chunk, right_padding=[longest - n for n in chunk])
    batch.update_and_fetch(step, step)
    batch.finalize()
    assert batch.left_padding.tolist() == [25, 2, 14]
    assert batch.offset.tolist() == [8, 31, 19]
    for i, ((row, _), n) in enumerate(zip(rows, chunk, strict=True)):
        row.update_and_fetch(step[i : i + 1, :, :n], step[i : i + 1, :, :n])
        assert _same_row(batch, i, row)


# --- the engine -----------------------------------------------------------------------------


@attrs.frozen
class Served:
    """What one engine setting served of the same traffic: each prompt alone, then all
    together in the batch; and the bytes its prefix cache held afterwards."""

    lone: list[Run]
    batched: list[Run]
    prefix_cache_bytes: int


@pytest.fixture(scope="module")
def served(small_model: Path) -> dict[int | None, Served]:
    """The same traffic through one engine per setting (none, 8, 4 bits)."""

    async def serve(bits: int | None) -> Served:
        async with open_engine(_config(small_model, bits)) as engine:
            lone, batched = await _lone_then_batched(engine)
            stats = engine.statistics().worker
            assert stats is not None and stats.prefix_cache is not None
            return Served(lone, batched, stats.prefix_cache.nbytes)

    return {bits: trio.run(serve, bits) for bits in (None, 8, 4)}


async def test_batched_and_lone_sequences_agree_under_quantization(
    served: dict[int | None, Served],
) -> None:
    for bits in (8, 4):
        for alone, together in zip(served[bits].lone, served[bits].batched, strict=True):
            assert together.tokens == alone.tokens and len(alone.tokens) == 6
            assert _logprobs(together) == pytest.approx(_logprobs(alone), abs=1e-3)


async def test_8_bit_kv_stays_close_to_the_unquantized_cache(
    served: dict[int | None, Served],
) -> None:
    reference, quantized = served[None].lone, served[8].lone
    assert [r.tokens for r in quantized] == [r.tokens for r in reference]
    for exact, approximate in zip(reference, quantized, strict=True):
        assert _logprobs(approximate) == pytest.approx(_logprobs(exact), abs=0.05)
    # The comparison can fail: 4 bits moves the logprobs much further than 8 does.
    drift = {
        bits: max(
            abs(a - b)
            for exact, other in zip(reference, served[bits].lone, strict=True)
            for a, b in zip(_logprobs(exact), _logprobs(other), strict=True)
        )
        for bits in (8, 4)
    }
    assert drift[4] > drift[8] > 0


def test_the_prefix_cache_holds_quantized_bytes(served: dict[int | None, Served]) -> None:
    # What a token's KV costs, float32: keys and values x heads x dimension x 4 bytes; quantized:
    # the packed values and a float32 scale and bias per group of 32.
    per_token = {
        None: 2 * HEADS * DIM * 4 * LAYERS,
        8: 2 * HEADS * (DIM + 8) * LAYERS,
        4: 2 * HEADS * (DIM // 2 + 8) * LAYERS,
    }
    stored = {bits: s.prefix_cache_bytes for bits, s in served.items()}
    # The prefix cache holds the same token counts whatever the setting: bytes shrink as KV does.
    assert stored[8] / stored[None] == pytest.approx(per_token[8] / per_token[None], rel=0.02)
    assert stored[4] / stored[None] == pytest.approx(per_token[4] / per_token[None], rel=0.02)


def test_a_quantized_tokens_kv_cost_read_before_the_load_is_the_one_measured_after(
    small_model: Path,
) -> None:
    """The model list's context before a load (`ModelFacts.kv_layout`) counts a quantized
    cache's packed values, scales and biases as the engine's caches hold them."""
    layout = model_facts(small_model).kv_layout
    assert layout is not None
    model = load_model(small_model).model
    for bits in (None, 4, 8):
        quantization = None if bits is None else KVQuantization(bits, GROUP)
        measured = kv_bytes_per_token(model, cache_factory(quantization))
        assert layout.bytes_per_token(bits, GROUP) == measured, bits


async def test_the_kv_budget_holds_more_quantized_tokens(small_model: Path) -> None:
    budget = 1 << 22
    tokens = {}
    for bits in (None, 4):
        async with open_engine(_config(small_model, bits, kv_cache_bytes=budget)) as engine:
            tokens[bits] = engine.model.kv_budget_tokens
    assert tokens[None] == budget // (2 * HEADS * DIM * 4 * LAYERS)
    assert tokens[4] == budget // (2 * HEADS * (DIM // 2 + 8) * LAYERS)


async def test_a_prefix_cache_hit_under_quantization_gives_the_cold_runs_tokens(
    small_model: Path,
) -> None:
    async with open_engine(_config(small_model, 4)) as engine:
        await _prefix_hits(engine)


async def _prefix_hits(engine: Engine) -> None:
    text = "A shared prefix long enough to span several prefill chunks of the engine. " * 4
    cold = await collect(engine, request(engine, text + "First.", max_tokens=6, ignore_eos=True))
    hits = await collect_all(
        engine,
        [
            request(engine, text + "First.", max_tokens=6, ignore_eos=True),
            request(engine, text + "Second one.", max_tokens=6, ignore_eos=True),
        ],
    )
    assert hits[0].tokens == cold.tokens
    for hit in hits:
        assert hit.final.usage is not None and hit.final.usage.cached_tokens > 60


async def test_a_cancel_under_quantization_spares_the_batch_and_returns_the_lane(
    small_model: Path,
) -> None:
    async with open_engine(_config(small_model, 8)) as engine:
        await _cancel_beside(engine)


async def _cancel_beside(engine: Engine) -> None:
    survivor = request(engine, PROMPTS[0], max_tokens=12, ignore_eos=True, sampling=SEEDED)
    alone = await collect(engine, survivor)
    runs: dict[str, Run] = {}

    async def run_survivor() -> None:
        runs["survivor"] = await collect(engine, survivor)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_survivor)
        with trio.CancelScope() as scope:
            async with engine.generate(
                request(engine, PROMPTS[2], max_tokens=500, ignore_eos=True)
            ) as stream:
                seen = 0
                async for _ in stream:
                    seen += 1
                    if seen == 4:
                        scope.cancel()
    assert runs["survivor"].tokens == alone.tokens
    stats = engine.statistics()
    assert stats.lanes_borrowed == 0 and stats.late_events == 0


async def test_a_head_dimension_the_group_size_does_not_divide_fails_the_load(
    tiny_model: Path,
) -> None:
    with pytest.raises(ExceptionGroup) as failure:  # the load's, from the engine's nursery
        async with open_engine(EngineConfig(tiny_model, kv_bits=8, warmup=False)):
            pass
    assert failure.group_contains(KVQuantizationError, match=r"head dimension \(16\)")


async def test_quantized_kv_speculates_with_plain_decodings_tokens(small_model: Path) -> None:
    """Speculation's verify steps write and trim quantized KV rows as they do plain ones."""
    text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 3
    runs = []
    for speculation in (None, Speculation(tokens=4, adaptive=False)):
        async with open_engine(_config(small_model, 8, speculation=speculation)) as engine:
            runs.append(
                await collect(engine, request(engine, text, max_tokens=24, ignore_eos=True))
            )
    plain, speculated = runs
    assert speculated.tokens == plain.tokens
    usage = speculated.final.usage
    assert usage is not None and usage.draft_tokens > 0 and usage.accepted_draft_tokens > 0


async def test_quantized_kv_goes_to_disk_and_back_and_no_other_width_serves_it(
    small_model: Path, tmp_path: Path
) -> None:
    """With --prompt-cache-dir the disk tier stores the quantized arrays as held: a fresh
    engine of the same width serves them as the cold run; an engine of another width never
    looks them up, and refuses (and counts) such a file put where its own would be."""
    text = "A shared prefix long enough to span several prefill chunks of the engine. " * 2

    async def serve(bits: int | None) -> tuple[Run, Any]:
        config = _config(small_model, bits, prompt_cache_dir=tmp_path, prompt_cache_disk_block=32)
        async with open_engine(config) as engine:
            run = await collect(engine, request(engine, text, max_tokens=4, ignore_eos=True))
            return run, engine.statistics().worker

    cold, _ = await serve(8)
    quantized = _new_file(tmp_path, set())
    warm, _ = await serve(8)
    plain, _ = await serve(None)
    _new_file(tmp_path, {quantized}).write_bytes(quantized.read_bytes())
    refused, stats = await serve(None)

    prompt_tokens = cold.final.usage.prompt_tokens if cold.final.usage else 0
    assert prompt_tokens > 32
    assert warm.final.usage is not None and warm.final.usage.cached_tokens == prompt_tokens - 1
    assert warm.tokens == cold.tokens
    for run in (plain, refused):
        assert run.final.usage is not None and run.final.usage.cached_tokens == 0
    assert refused.tokens == plain.tokens
    assert stats.prefix_disk is not None and stats.prefix_disk.rejected == 1


def _new_file(directory: Path, known: set[Path]) -> Path:
    (new,) = set(directory.iterdir()) - known
    return new
