"""The running batch's KV cache (`_ragged.py`) and the decode attention over it
(`_decode_attention.py`).

`RaggedBatchKVCache` must hold exactly what mlx-lm's `BatchKVCache` holds after the same
operations (the batch generator's whole life: merge, decode, filter, extend, a padded
chunk, extract), with its host copy of the padding always equal to the device's. The
CUDA kernel is compared with MLX's masked attention where CUDA runs; elsewhere the router
must leave every call to mlx-lm's function.
"""

from __future__ import annotations

import random
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache, RotatingKVCache

from mlx_nursery.engine._decode_attention import available, ragged_decode_attention, routed
from mlx_nursery.engine._memory import KV_STEP
from mlx_nursery.engine._ragged import (
    RaggedBatchKVCache,
    RowKVCache,
    _layout,
    ragged_rows,
    shift_rows,
)

HEADS, DIM = 2, 8


def rows(lengths: list[int], seed: int, row_class: type) -> list[Any]:
    out = []
    for i, n in enumerate(lengths):
        cache = row_class()
        key = mx.random.key(seed * 100 + i)
        k, v = mx.random.normal((2, 1, HEADS, n, DIM), key=key)
        cache.update_and_fetch(k, v)
        out.append(cache)
    return out


def pair(lengths: list[int], seed: int) -> tuple[RaggedBatchKVCache, BatchKVCache]:
    ours = RaggedBatchKVCache.merge(rows(lengths, seed, RowKVCache))
    theirs = BatchKVCache.merge(rows(lengths, seed, KVCache))
    return ours, theirs


def assert_same(ours: RaggedBatchKVCache, theirs: BatchKVCache) -> None:
    """Each row holds what mlx-lm's holds, ending at the write index; where the decode
    attention reads rows from their starts, the padding before a row may be longer (a filter
    drops only whole steps of it), elsewhere it is mlx-lm's."""
    if not _layout.rows_read_from_their_starts:
        assert ours._idx == theirs._idx
        assert ours.padding == theirs.left_padding.tolist()
    assert ours.padding == ours.left_padding.tolist()
    assert ours.offset.tolist() == theirs.offset.tolist()
    assert ours.offset.tolist() == [ours._idx - p for p in ours.padding]
    k_ours, v_ours = ours.keys_and_values()
    k_theirs, v_theirs = theirs.keys_and_values()
    starts = zip(ours.padding, theirs.left_padding.tolist(), strict=True)
    for row, (mine, upstream) in enumerate(starts):  # what a row holds: from its padding on
        assert mx.array_equal(k_ours[row, :, mine:], k_theirs[row, :, upstream:])
        assert mx.array_equal(v_ours[row, :, mine:], v_theirs[row, :, upstream:])


def decode(caches: list[Any], rows_: int, seed: int) -> None:
    k, v = mx.random.normal((2, rows_, HEADS, 1, DIM), key=mx.random.key(seed))
    for cache in caches:
        cache.update_and_fetch(k, v)


def test_a_batch_lives_as_mlx_lms_does() -> None:
    ours, theirs = pair([5, 9, 3, 7], seed=1)
    assert isinstance(ours, RaggedBatchKVCache)
    assert_same(ours, theirs)
    for step in range(3):
        decode([ours, theirs], 4, seed=10 + step)
    assert_same(ours, theirs)

    ours.filter([0, 2, 3])  # the longest row leaves: the common padding goes too
    theirs.filter(mx.array([0, 2, 3]))
    assert_same(ours, theirs)
    ours.filter([1, 2])
    theirs.filter(mx.array([1, 2]))
    assert_same(ours, theirs)

    joining_ours, joining_theirs = pair([4, 20], seed=2)  # longer than the batch: it pads
    ours.extend(joining_ours)
    theirs.extend(joining_theirs)
    assert_same(ours, theirs)
    decode([ours, theirs], 4, seed=20)
    assert_same(ours, theirs)

    for row in range(4):
        mine, upstream = ours.extract(row), theirs.extract(row)
        assert isinstance(mine, RowKVCache)
        assert mine.offset == upstream.offset
        assert mx.array_equal(mine.keys, upstream.keys)
        assert mx.array_equal(mine.values, upstream.values)


@pytest.fixture(params=[False, True], ids=["masked", "rows-from-their-starts"])
def rows_read(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both ways a batch's decode attention can read it: MLX's masked attention over every
    row's padded length, or each row from its own start (`read_from_row_starts`)."""
    monkeypatch.setattr(_layout, "rows_read_from_their_starts", request.param)
    return bool(request.param)


def test_buffers_are_whole_steps_so_that_their_sizes_recur(rows_read: bool) -> None:
    """mlx-lm's buffers come out of merges, growth and filters at any length, so every
    join and leave frees the batch's KV in sizes never asked for again (module docstring);
    ours are merged and grown in whole steps, and kept so by a filter where the padding it
    leaves is never read; each row holds what mlx-lm's does throughout."""
    ours, theirs = pair([KV_STEP * 2 - 2, 10, 120], seed=21)
    lengths: dict[str, list[int]] = {"ours": [], "mlx-lm": []}

    def note() -> None:
        assert ours.keys is not None and theirs.keys is not None
        lengths["ours"].append(ours.keys.shape[2])
        lengths["mlx-lm"].append(theirs.keys.shape[2])
        assert_same(ours, theirs)

    note()
    for step in range(4):  # past a step's end: the buffer grows
        decode([ours, theirs], 3, seed=30 + step)
        note()
    assert all(n % KV_STEP == 0 for n in lengths["ours"])  # merged and grown in whole steps
    assert any(n % KV_STEP for n in lengths["mlx-lm"])  # what the test tells apart
    ours.filter([1, 2])  # the longest leaves: over a step of padding common to the rest
    theirs.filter(mx.array([1, 2]))
    note()
    if rows_read:
        assert 0 < min(ours.padding) < KV_STEP  # whole steps dropped, the rest kept
    else:
        assert min(ours.padding) == 0  # all of it, as mlx-lm drops it
    joining_ours, joining_theirs = pair([KV_STEP + 3], seed=22)
    ours.extend(joining_ours)
    theirs.extend(joining_theirs)
    note()
    decode([ours, theirs], 3, seed=40)
    note()
    if rows_read:
        assert all(n % KV_STEP == 0 for n in lengths["ours"])


def test_a_steps_layers_share_one_offset_array() -> None:
    """mlx-lm adds a step's tokens to each layer's `offset`, one kernel per layer for the same
    values; the ragged cache's layers of a step share one array made from the host."""
    layers = [RaggedBatchKVCache.merge(rows([3, 5, 2], 7, RowKVCache)) for _ in range(4)]
    for step in range(2):
        decode(layers, 3, step)
        first = layers[0].offset
        assert all(layer.offset is first for layer in layers)
        assert first.tolist() == [layers[0]._idx - p for p in layers[0].padding]
    assert first.tolist() == [5, 7, 4]
    for layer in layers:  # rows joining every layer (their prompt batch's caches)
        layer.extend(RaggedBatchKVCache.merge(rows([2, 9], 3, RowKVCache)))
    assert all(layer.offset is layers[0].offset for layer in layers)
    assert all(layer.left_padding is layers[0].left_padding for layer in layers)
    assert layers[0].offset.tolist() == [5, 7, 4, 2, 9]
    for layer in layers:  # a verify's rejected positions, dropped from every layer
        assert layer.trim(2) == 2
    assert all(layer.offset is layers[0].offset for layer in layers)
    assert layers[0].offset.tolist() == [3, 5, 2, 0, 7]
    ours, theirs = pair([3, 5, 2], seed=7)
    decode([ours, theirs], 3, seed=1)
    for cache in (ours, theirs):
        assert cache.trim(2) == 2 and cache.trim(9) == 4  # never past the write index
    assert_same(ours, theirs)


def test_a_padded_prefill_chunk_moves_the_padding_as_mlx_lm_does() -> None:
    ours, theirs = pair([6, 2, 4], seed=3)
    chunk = [3, 1, 2]  # tokens each row prefills in this chunk
    padding = [max(chunk) - n for n in chunk]
    k, v = mx.random.normal((2, 3, HEADS, max(chunk), DIM), key=mx.random.key(4))
    for cache in (ours, theirs):
        cache.prepare(lengths=chunk, right_padding=padding)
        cache.update_and_fetch(k, v)
        cache.finalize()
    assert_same(ours, theirs)
    ours.filter([1])
    theirs.filter(mx.array([1]))
    assert_same(ours, theirs)


def test_a_padded_chunk_moves_only_rows_and_leaves_the_old_buffer_as_it_was() -> None:
    """Rows with long cached prefixes (as prefix-cache hits bring) and a row that held
    nothing, padded unequally: each row's tokens end at the index as mlx-lm's roll puts
    them, and the buffer before the chunk (a state handed out earlier) is not changed."""
    ours, theirs = pair([40, 0, 33, 40], seed=13)
    chunk = [1, 4, 2, 4]
    padding = [max(chunk) - n for n in chunk]
    k, v = mx.random.normal((2, 4, HEADS, max(chunk), DIM), key=mx.random.key(14))
    for cache in (ours, theirs):
        cache.prepare(lengths=chunk, right_padding=padding)
        cache.update_and_fetch(k, v)
    before = ours.keys
    assert before is not None
    kept = np.array(before)  # a copy on the host
    for cache in (ours, theirs):
        cache.finalize()
    assert_same(ours, theirs)
    assert np.array_equal(np.array(before), kept)
    assert ours.padding == [3, 40, 9, 0]
    decode([ours, theirs], 4, seed=15)
    assert_same(ours, theirs)


def test_layers_filtered_together_then_padded_keep_their_own_padding() -> None:
    """`filter` shares the padding arrays between a batch's layers; a padded chunk after it
    (a speculative verify's realignment, a padded chunk after a prompt left the prompt
    batch) must leave every layer's padding right (mlx-lm's `finalize` adds to
    `left_padding` in place, which on shared arrays would add each layer's to all)."""
    layers = [pair([6, 2, 4], seed=8) for _ in range(3)]
    for ours, theirs in layers:
        ours.filter([0, 2])
        theirs.filter(mx.array([0, 2]))
    assert layers[0][0].left_padding is layers[1][0].left_padding  # shared, as designed
    k, v = mx.random.normal((2, 2, HEADS, 3, DIM), key=mx.random.key(9))
    for ours, theirs in layers:
        for cache in (ours, theirs):
            cache.prepare(lengths=[1, 3], right_padding=[2, 0])
            cache.update_and_fetch(k, v)
            cache.finalize()
    for ours, theirs in layers:
        assert_same(ours, theirs)
    first = layers[0][0]  # the padding's arrays were made once for all layers
    assert all(ours.left_padding is first.left_padding for ours, _ in layers)
    assert all(ours.offset is first.offset for ours, _ in layers)


def test_left_padding_prepared_on_empty_caches_is_mlx_lms() -> None:
    ours, theirs = RaggedBatchKVCache([0, 1, 0]), BatchKVCache([0, 1, 0])
    k, v = mx.random.normal((2, 3, HEADS, 4, DIM), key=mx.random.key(5))
    for cache in (ours, theirs):
        cache.prepare(left_padding=[2, 0, 1])
        cache.update_and_fetch(k, v)
    assert_same(ours, theirs)
    with pytest.raises(ValueError):
        ours.prepare(left_padding=[1, 1, 1])  # as mlx-lm: only an empty cache


def test_rows_moved_right_after_a_verify_hold_what_mlx_lms_roll_gives() -> None:
    """Speculation's realignment (`shift_rows`): after a forward of 4 positions a row, rows
    keep 4, 1, 2 and 0+1 of them; the index goes back to the most kept and the others move
    right, as mlx-lm's right-padding roll moves them."""
    ours, theirs = pair([6, 2, 4, 5], seed=10)
    ours.filter([0, 1, 2, 3])  # shared padding arrays, as in a running batch
    k, v = mx.random.normal((2, 4, HEADS, 4, DIM), key=mx.random.key(11))
    kept = [4, 1, 2, 1]
    for cache in (ours, theirs):
        cache.update_and_fetch(k, v)
        cache.trim(4 - max(kept))
    shift_rows([ours], [max(kept) - n for n in kept])
    theirs.prepare(right_padding=[max(kept) - n for n in kept])
    theirs.finalize()
    assert_same(ours, theirs)
    decode([ours, theirs], 4, seed=12)
    assert_same(ours, theirs)


def test_everyone_leaving_and_empty_batches() -> None:
    ours = RaggedBatchKVCache.merge(rows([0, 0], seed=5, row_class=RowKVCache))
    assert ours.padding == [0, 0] and ours.keys is None
    other, _ = pair([3], seed=6)
    ours.extend(other)
    assert ours.padding == [3, 3, 0]
    ours.filter([])
    assert ours.padding == [] and ours.keys is not None and ours.keys.shape[0] == 0


def test_only_plain_kv_caches_become_ragged_rows() -> None:
    plain, rotating = KVCache(), RotatingKVCache(max_size=8)
    cache = ragged_rows([plain, rotating])
    assert type(cache[0]) is RowKVCache and cache[0] is plain
    assert type(cache[1]) is RotatingKVCache


def test_the_router_leaves_every_other_call_to_mlx_lm() -> None:
    calls: list[tuple[Any, ...]] = []

    def original(q: mx.array, k: mx.array, v: mx.array, **kwargs: Any) -> mx.array:
        calls.append((q.shape, kwargs["cache"], kwargs["mask"]))
        return q

    attend = routed(original)
    ours, _ = pair([3, 5], seed=7)
    q = mx.zeros((2, 4, 2, DIM))  # a two-token query: a prefill chunk, not a decode step
    k, v = ours.keys_and_values()
    assert attend(q, k, v, cache=ours, scale=1.0, mask=None) is q
    plain = KVCache()
    q1 = mx.zeros((1, 4, 1, DIM))
    assert attend(q1, k, v, cache=plain, scale=1.0, mask="causal") is q1
    sinks = mx.zeros((4,))
    q2 = mx.zeros((2, 4, 1, DIM))
    assert attend(q2, k, v, cache=ours, scale=1.0, mask=None, sinks=sinks) is q2
    assert [c[1] for c in calls] == [ours, plain, ours]


@pytest.mark.skipif(not available(), reason="the kernel is CUDA's; MLX runs elsewhere here")
@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "dim", "dtype"),
    [
        (1, 32, 8, 128, mx.bfloat16),  # few rows: the keys in slices, then combined
        (7, 28, 4, 128, mx.float16),
        (5, 8, 8, 64, mx.float32),
        (20, 32, 8, 128, mx.bfloat16),  # rows x heads past the target blocks: one kernel
    ],
)
def test_the_kernel_equals_masked_attention(
    batch: int, heads: int, kv_heads: int, dim: int, dtype: mx.Dtype
) -> None:
    rng = random.Random(batch)
    caches = []
    for i in range(batch):
        cache = RowKVCache()
        n = rng.randint(1, 700)
        k, v = mx.random.normal((2, 1, kv_heads, n, dim), key=mx.random.key(i))
        cache.update_and_fetch(k.astype(dtype), v.astype(dtype))
        caches.append(cache)
    batch_cache = RaggedBatchKVCache.merge(caches)
    mask = batch_cache.make_mask(1)
    k, v = mx.random.normal((2, batch, kv_heads, 1, dim), key=mx.random.key(99))
    keys, values = batch_cache.update_and_fetch(k.astype(dtype), v.astype(dtype))
    q = mx.random.normal((batch, heads, 1, dim)).astype(dtype)
    want = mx.fast.scaled_dot_product_attention(q, keys, values, scale=dim**-0.5, mask=mask)
    got = ragged_decode_attention(q, batch_cache, dim**-0.5)
    tolerance = 1e-4 if dtype == mx.float32 else 2e-2
    assert mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=tolerance).item()


def test_each_engine_thread_shares_arrays_of_its_own() -> None:
    """Engines run on threads of their own, with MLX streams of their own: the arrays one
    thread's layers share are not handed to another's."""
    import threading

    from mlx_nursery.engine._ragged import _offsets

    here = _offsets(9, [1, 2])
    assert _offsets(9, [1, 2]) is here
    there: list[Any] = []
    worker = threading.Thread(target=lambda: there.append(_offsets(9, [1, 2])))
    worker.start()
    worker.join()
    assert there[0] is not here
    assert there[0].tolist() == here.tolist() == [8, 7]
