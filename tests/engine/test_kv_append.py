"""New keys written into the batch's KV buffers in place (`_kv_append.py`).

Where CUDA runs, the kernel's writes must equal MLX's slice update bit for bit (a buffer
that is a view of a larger one included), and a batch living through merges, pipelined
decode steps, a filter, a join, a padded chunk and a trim must hold what it holds with
MLX's updates. Everywhere: the cache writes in place only where it may (its own buffers,
the index never moved back since), and never where `writes_in_place` does not hold.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlx_nursery.engine import _kv_append
from mlx_nursery.engine._kv_quant import make_cache
from mlx_nursery.engine._ragged import RaggedBatchKVCache, RowKVCache, ragged_rows
from mlx_nursery.engine._upstream import KVCache
from mlx_nursery.models import load_model
from tests.engine.test_ragged_cache import DIM, HEADS, rows

cuda_only = pytest.mark.skipif(
    not _kv_append.writes_in_place(mx.float32), reason="the kernel is CUDA's, graphs off"
)


def batch(lengths: list[int], seed: int) -> RaggedBatchKVCache:
    return RaggedBatchKVCache.merge(rows(lengths, seed, RowKVCache))


@pytest.mark.parametrize(
    ("variable", "before", "after", "value", "known_off"),
    [
        (None, "", "", "0", True),  # defaulted before MLX ran anything
        (None, "import mlx.core", "", "0", True),  # loaded, nothing allocated yet
        (None, "import mlx.core as mx; mx.eval(mx.ones(2) + 1)", "", "0", False),  # it ran
        ("0", "", "", "0", True),  # the operator's
        ("1", "", "", "1", False),
        (None, "", "prepare(cuda_graphs=False)", "0", True),  # the engine's default kept
        (None, "", "prepare(cuda_graphs=True)", "1", False),
        ("1", "", "prepare(cuda_graphs=False)", "0", False),  # changed after MLX may have read
    ],
)
def test_cuda_graphs_are_known_off_only_where_mlx_cannot_have_read_otherwise(
    variable: str | None, before: str, after: str, value: str, known_off: bool
) -> None:
    """MLX reads `MLX_USE_CUDA_GRAPHS` at its first kernel (unset: on). The package sets the
    engine's default (off) as it is imported, unless the operator set it; the in-place
    writes count on graphs being off only where MLX cannot have read another value."""
    import os
    import subprocess
    import sys

    code = "; ".join(
        line
        for line in (
            before,
            "import os",
            "from mlx_nursery.engine._backend import cuda_graphs_known_off, prepare_backend",
            "prepare = lambda **kw: prepare_backend(cudnn_attention=False, **kw)",
            after,
            "print(os.environ['MLX_USE_CUDA_GRAPHS'], cuda_graphs_known_off())",
        )
        if line
    )
    env = {k: v for k, v in os.environ.items() if k != "MLX_USE_CUDA_GRAPHS"}
    if variable is not None:
        env["MLX_USE_CUDA_GRAPHS"] = variable
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.split() == [value, str(known_off)], run.stderr


def test_a_kernel_that_cannot_run_leaves_mlxs_updates_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`usable` runs the kernel once per dtype against MLX's update; where it fails (here:
    no CUDA to build it on) the cache keeps MLX's updates and the log says why."""
    if _kv_append.on_cuda():
        pytest.skip("the kernel runs here")
    _kv_append._checked.pop(mx.float16, None)
    with caplog.at_level(logging.WARNING, logger="mlx_nursery.engine"):
        assert not _kv_append.usable(mx.float16)
    assert any("in-place KV write unusable" in r.getMessage() for r in caplog.records)


@pytest.fixture
def writes_recorded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """In-place writes allowed, and recorded rather than run (the kernel is CUDA's): one
    entry a write the cache took in place."""
    calls: list[int] = []

    def recorded(keys: mx.array, values: mx.array, *_: Any) -> mx.array:
        calls.append(1)
        return mx.zeros((1,), dtype=mx.int32)

    monkeypatch.setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: True)
    monkeypatch.setattr(_kv_append, "append_in_place", recorded)
    return calls


def test_the_cache_writes_in_place_only_into_buffers_of_its_own(
    writes_recorded: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision alone (the kernel is CUDA's): merged buffers are the cache's own; after a
    trim a lazy forward may still read past the index, after `state` was set or a deep copy
    the arrays may be another cache's, so the next write is MLX's, and the one after in
    place again; keys of another dtype than the buffers' are MLX's to write."""
    calls = writes_recorded
    cache = batch([3, 5], seed=1)
    k, v = mx.random.normal((2, 2, HEADS, 1, DIM))

    def in_place() -> bool:
        before = len(calls)
        cache.update_and_fetch(k, v)
        return len(calls) > before

    assert in_place()
    cache.trim(1)
    assert not in_place()
    assert in_place()
    cache.state = cache.state
    assert not in_place()
    assert in_place()
    copied = copy.deepcopy(cache)  # as mlx-lm's split copies a batch: the same buffers
    assert not in_place()
    assert in_place()
    before = len(calls)
    copied.update_and_fetch(k, v)
    assert len(calls) == before  # the copy's first write is MLX's too
    k16, v16 = k.astype(mx.float16), v.astype(mx.float16)
    before = len(calls)
    cache.update_and_fetch(k16, v16)  # keys of another dtype than the buffers': MLX's
    assert len(calls) == before
    monkeypatch.setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: False)
    assert not in_place()


@cuda_only
@pytest.mark.parametrize(
    ("rows", "heads", "dim", "dtype", "length", "view"),
    [
        (1, 8, 128, mx.bfloat16, 1, False),
        (32, 8, 128, mx.bfloat16, 1, True),
        (5, 4, 128, mx.float16, 7, False),
        (3, 8, 64, mx.float32, 33, True),
    ],
)
def test_the_kernel_writes_what_a_slice_update_writes(
    rows: int, heads: int, dim: int, dtype: mx.Dtype, length: int, view: bool
) -> None:
    whole_k = mx.random.normal((rows + 2, heads, 256, dim), key=mx.random.key(1)).astype(dtype)
    whole_v = mx.random.normal((rows + 2, heads, 256, dim), key=mx.random.key(2)).astype(dtype)
    want_k, want_v = whole_k + 0, whole_v + 0  # copies, made before the write
    mx.eval(whole_k, whole_v, want_k, want_v)
    lo = 1 if view else 0
    keys, values = (whole_k[lo : lo + rows], whole_v[lo : lo + rows])
    new_k, new_v = mx.random.normal((2, rows, heads, length, dim), key=mx.random.key(3))
    new_k, new_v = new_k.astype(dtype), new_v.astype(dtype)
    written = _kv_append.append_in_place(keys, values, new_k, new_v, 100)
    mx.eval(mx.depends([keys, values], [written]))
    want_k[lo : lo + rows, :, 100 : 100 + length] = new_k
    want_v[lo : lo + rows, :, 100 : 100 + length] = new_v
    assert mx.array_equal(whole_k, want_k).item()
    assert mx.array_equal(whole_v, want_v).item()


@cuda_only
def test_a_batch_written_in_place_holds_what_mlxs_updates_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def life(in_place: bool) -> list[tuple[mx.array, mx.array]]:
        monkeypatch.setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: in_place)
        cache = batch([3, 9, 5], seed=2)
        held = []
        for step in range(6):  # pipelined, as the engine decodes: launched, read a step later
            k, v = mx.random.normal((2, 3, HEADS, 1, DIM), key=mx.random.key(10 + step))
            keys, values = cache.update_and_fetch(k, v)
            mx.async_eval(keys, values)
            held.append((mx.sum(keys), mx.sum(values)))
        cache.filter([0, 2])
        cache.extend(batch([4], seed=3))
        k, v = mx.random.normal((2, 3, HEADS, 4, DIM), key=mx.random.key(30))
        cache.prepare(lengths=[4, 2, 3], right_padding=[0, 2, 1])
        cache.update_and_fetch(k, v)
        cache.finalize()
        cache.trim(2)
        k, v = mx.random.normal((2, 3, HEADS, 1, DIM), key=mx.random.key(40))
        held.append(cache.update_and_fetch(k, v))
        return held

    for (a_k, a_v), (b_k, b_v) in zip(life(True), life(False), strict=True):
        assert mx.array_equal(a_k, b_k).item()
        assert mx.array_equal(a_v, b_v).item()


def test_a_sequence_writes_in_place_only_into_buffers_of_its_own(
    writes_recorded: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone sequence's cache (`RowKVCache`, the fast path's and a row's before it joins)
    follows the batch's rules: its first write allocates (MLX's), the next ones go in place
    until a trim, a `state` set or a deep copy (the prefix cache's hits share the entry's
    buffers) makes the next one MLX's; a write past the buffer's end grows it (MLX's); a
    plain `KVCache` made a row in place writes MLX's way first."""
    calls = writes_recorded
    cache = RowKVCache()
    k, v = mx.random.normal((2, 1, HEADS, 1, DIM))

    def in_place(row: RowKVCache = cache, length: int = 1) -> bool:
        before, offset = len(calls), row.offset
        keys, _ = row.update_and_fetch(mx.repeat(k, length, axis=2), mx.repeat(v, length, axis=2))
        assert row.offset == offset + length == keys.shape[2]  # the fetched layout holds
        return len(calls) > before

    assert not in_place()  # no buffers yet: MLX's allocation and write
    assert in_place()
    assert in_place()
    cache.trim(1)
    assert not in_place()
    assert in_place()
    cache.state = cache.state
    assert not in_place()
    assert in_place()
    copied = copy.deepcopy(cache)
    assert not in_place() and not in_place(copied)
    assert in_place() and in_place(copied)
    assert not in_place(length=KVCache.step)  # past the buffer's end: grown by MLX
    assert not in_place()  # mlx-lm grew it to the new end exactly: grown again
    assert in_place()
    k16 = k.astype(mx.float16)
    before = len(calls)
    cache.update_and_fetch(k16, k16)  # keys of another dtype than the buffers': MLX's
    assert len(calls) == before
    plain = KVCache()
    plain.update_and_fetch(k, v)
    (row,) = ragged_rows([plain])
    assert not in_place(row)
    assert in_place(row)
    monkeypatch.setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: False)
    assert not in_place()


def test_a_fresh_cache_of_a_model_is_made_of_rows(tiny_model: Path) -> None:
    """The steppers' caches (`_kv_quant.make_cache` without quantization) are `RowKVCache`s
    for every plain layer: the fast path writes in place too, and rows join the batch as
    ragged rows."""
    loaded = load_model(tiny_model)
    cache = make_cache(loaded.model, None)
    assert cache and all(type(layer) is RowKVCache for layer in cache)


@cuda_only
def test_a_sequence_written_in_place_holds_what_mlxs_updates_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def life(in_place: bool) -> list[tuple[mx.array, mx.array]]:
        monkeypatch.setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: in_place)
        cache = RowKVCache()
        held = []
        k, v = mx.random.normal((2, 1, HEADS, 250, DIM), key=mx.random.key(5))
        cache.update_and_fetch(k, v)
        for step in range(10):  # pipelined, across the buffer's growth at 256
            k, v = mx.random.normal((2, 1, HEADS, 1, DIM), key=mx.random.key(10 + step))
            keys, values = cache.update_and_fetch(k, v)
            mx.async_eval(keys, values)
            held.append((mx.sum(keys), mx.sum(values)))
        cache.trim(3)  # its next write is MLX's: the steps before may still read past it
        for step in range(3):
            k, v = mx.random.normal((2, 1, HEADS, 2, DIM), key=mx.random.key(30 + step))
            keys, values = cache.update_and_fetch(k, v)
            mx.async_eval(keys, values)
            held.append((mx.sum(keys), mx.sum(values)))
        held.append(cache.keys_and_values())
        return held

    for (a_k, a_v), (b_k, b_v) in zip(life(True), life(False), strict=True):
        assert mx.array_equal(a_k, b_k).item()
        assert mx.array_equal(a_v, b_v).item()
