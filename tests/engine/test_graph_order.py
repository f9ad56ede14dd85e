"""In-place KV writes under MLX's CUDA graphs (`_kv_append`'s docstring, decisions/0059).

With graphs on, MLX orders a graph's kernels only by the arrays they declare, and the write
declares the buffers as read, so many readers could run beside it: there only an ordered
writer writes in place (the decode prelude, whose output is the queries the step reads next
and which takes the cache's previous write as an input); every other write is MLX's update.
On the GPU, a batch and a lone sequence decoded under graphs give the logits of MLX's
updates, the lone sequence's keys written in place by the prelude.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models import llama

from mlx_nursery.engine import _decode_prelude, _kv_append
from mlx_nursery.engine._backend import on_cuda
from mlx_nursery.engine._ragged import RaggedBatchKVCache, RowKVCache
from tests.engine.test_decode_prelude import blocks, model_of
from tests.engine.test_ragged_cache import DIM, HEADS, rows


@pytest.fixture
def graphs_on(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The backend's facts as on a GPU with CUDA graphs on, the write recorded rather than
    run (the kernel is CUDA's): one entry a write taken in place."""
    calls: list[int] = []

    def recorded(keys: mx.array, values: mx.array, *_: Any) -> mx.array:
        calls.append(1)
        return mx.zeros((1,), dtype=mx.int32)

    monkeypatch.setattr(_kv_append, "on_cuda", lambda: True)
    monkeypatch.setattr(_kv_append, "usable", lambda dtype: True)
    monkeypatch.setattr(_kv_append, "cuda_graphs_known_off", lambda: False)
    monkeypatch.setattr(_kv_append, "append_in_place", recorded)
    return calls


@pytest.mark.parametrize("kind", ["batch", "sequence"])
def test_under_graphs_only_an_ordered_writer_writes_in_place(
    graphs_on: list[int], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache: Any = (
        RaggedBatchKVCache.merge(rows([3, 5], 1, RowKVCache)) if kind == "batch" else RowKVCache()
    )
    count = 2 if kind == "batch" else 1
    k, v = mx.random.normal((2, count, HEADS, 1, DIM))
    for _ in range(3):  # a sequence's first update allocates; none is taken in place
        cache.update_and_fetch(k, v)
    assert graphs_on == [] and cache.pending_write is None
    slot = cache.write_slot(mx.float32, 1, ordered=True)  # the prelude's case
    assert slot is not None
    marker = mx.zeros((1,), mx.int32)
    cache.written(marker, 1)
    assert cache.pending_write is marker  # the next ordered write takes it as an input
    assert _decode_prelude.previous_write(cache) is marker
    cache.trim(1)  # the next write is MLX's, and leaves no marker behind
    assert cache.pending_write is None
    assert _decode_prelude.previous_write(cache).item() == 0
    monkeypatch.setattr(_kv_append, "cuda_graphs_known_off", lambda: True)
    cache.written(marker, 1)
    assert cache.pending_write is None  # graphs off: launch order, nothing kept
    assert _decode_prelude.previous_write(cache).item() == 0
    cache.trim(1)
    cache.update_and_fetch(k, v)  # MLX's (after the trim): the buffers are its own again
    cache.update_and_fetch(k, v)  # graphs off: in place
    assert graphs_on == [1]


def test_an_update_of_mlxs_commits_a_pending_write_first(
    graphs_on: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under graphs MLX's update reads the buffers without the marker: the write it follows
    is committed (evaluated asynchronously) before it is encoded."""
    committed: list[Any] = []
    monkeypatch.setattr(mx, "async_eval", lambda *arrays: committed.extend(arrays))
    cache = RowKVCache()
    k, v = mx.random.normal((2, 1, HEADS, 1, DIM))
    cache.update_and_fetch(k, v)
    assert committed == []  # nothing pending
    assert cache.write_slot(mx.float32, 1, ordered=True) is not None
    marker = mx.zeros((1,), mx.int32)
    cache.written(marker, 1)
    cache.update_and_fetch(k, v)  # not ordered under graphs: MLX's update
    assert committed == [marker] and cache.pending_write is None
    monkeypatch.setattr(_kv_append, "cuda_graphs_known_off", lambda: True)
    cache.written(marker, 1)
    cache._own_buffers = False  # the next update is MLX's
    cache.update_and_fetch(k, v)
    assert committed == [marker]  # graphs off: launch order suffices


def test_the_prelude_takes_the_previous_write_as_an_input(
    graphs_on: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_of(llama)
    monkeypatch.setattr(_decode_prelude, "on_cuda", lambda: True)
    _decode_prelude.install(model)
    plan = blocks(model)[0]._nursery_plan
    seen: list[mx.array] = []

    def kernel(*, inputs: list[mx.array], output_shapes: Any, output_dtypes: Any, **_: Any) -> Any:
        seen.append(inputs[-1])
        return [mx.zeros(output_shapes[0], output_dtypes[0])]

    monkeypatch.setattr(_decode_prelude, "_kernel", kernel)
    cache = RowKVCache()
    k = mx.zeros((1, plan.kv_heads, 4, plan.dim))
    cache.update_and_fetch(k, k)
    qkv = mx.zeros((1, 1, (plan.q_heads + 2 * plan.kv_heads) * plan.dim))
    first = _decode_prelude.prelude(qkv, cache, cache.offset, plan)
    cache.written(first, 1)
    _decode_prelude.prelude(qkv, cache, cache.offset, plan)
    assert seen[0].item() == 0 and seen[1] is first  # after an update of MLX's: a constant


GRAPHS_SCRIPT = """
import mlx.core as mx
from mlx_lm.models import llama
from mlx_nursery.engine import _decode_attention, _decode_prelude, _kv_append
from mlx_nursery.engine._backend import cuda_graphs_known_off
from mlx_nursery.engine._ragged import RaggedBatchKVCache
from mlx_nursery.engine._row_cache import ragged_rows
from mlx_nursery.engine._upstream import make_prompt_cache
from mlx_nursery.models._fusing import fuse_projections

assert not cuda_graphs_known_off()
args = llama.ModelArgs(
    model_type="llama", hidden_size=256, num_hidden_layers=2, intermediate_size=384,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=96,
)
mx.random.seed(3)
model = llama.Model(args)
mx.eval(model.parameters())
fuse_projections(model)
assert _decode_attention.install(model)
_decode_prelude.install(model)
real = _kv_append.writes_in_place
writes = []
append, prelude = _kv_append.append_in_place, _decode_prelude.prelude
def counted(*a):
    writes.append("append")
    return append(*a)
def counted_prelude(*a):
    writes.append("prelude")
    return prelude(*a)
_kv_append.append_in_place = counted
_decode_prelude.prelude = counted_prelude
prompts = [[5, 9, 2, 7, 1] * 40, [3, 8] * 70, [4, 4, 6, 1, 2, 9, 9, 3] * 30]

def life(in_place, form, pipelined):
    _kv_append.writes_in_place = real if in_place else (lambda dtype, ordered=False: False)
    caches = []
    for prompt in prompts if form == "batch" else prompts[:1]:
        cache = ragged_rows(make_prompt_cache(model))
        model(mx.array([prompt]), cache=cache)
        mx.eval([c.keys for c in cache])
        caches.append(cache)
    if form == "batch":
        cache = [RaggedBatchKVCache.merge([c[i] for c in caches]) for i in range(2)]
    else:
        (cache,) = caches
    tokens = mx.array([[11], [12], [13]][: len(caches)])
    out = []
    for _ in range(70):  # known tokens, past the buffers' growth at 256
        logits = model(tokens, cache=cache)
        if pipelined:  # launched before the step before is read, as the engine decodes
            mx.async_eval(logits)
        out.append(logits)
        tokens = (tokens * 7 + 1) % 96
    mx.eval(out)  # unpipelined: every step in one evaluation
    return out

for form, pipelined, batches in [
    ("batch", True, False), ("sequence", True, False), ("sequence", False, False),
    ("batch", True, True), ("batch", False, True),
]:
    _decode_prelude.BATCHES = batches  # the prelude in a running batch's step too
    want = life(False, form, pipelined)
    before = len(writes)
    got = life(True, form, pipelined)
    kinds = set(writes[before:])
    # under graphs only the prelude writes in place: a lone sequence's, a batch's if asked
    assert kinds == ({"prelude"} if form == "sequence" or batches else set()), kinds
    error = max(mx.abs(a - b).max().item() for a, b in zip(got, want))
    print(form, pipelined, batches, error)
    assert error < 1e-4, error
print("same")
"""


@pytest.mark.skipif(not on_cuda(), reason="CUDA graphs are CUDA's")
def test_a_decode_written_in_place_under_graphs_gives_mlxs_logits() -> None:
    """In a process with MLX's CUDA graphs on (MLX reads the switch once per process)."""
    env = {**os.environ, "MLX_USE_CUDA_GRAPHS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2] / "src"), *sys.path])
    run = subprocess.run(
        [sys.executable, "-c", GRAPHS_SCRIPT], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("same"), run.stdout + run.stderr
