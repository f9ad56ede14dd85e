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

from mlx_nursery.engine import _decode_prelude, _kv_append
from mlx_nursery.engine._backend import on_cuda
from mlx_nursery.engine._ragged import RaggedBatchKVCache, RowKVCache
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
    cache.update_and_fetch(k, v)  # MLX's (after the trim): the buffers are its own again
    cache.update_and_fetch(k, v)  # graphs off: in place
    assert graphs_on == [1]


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

def life(in_place, form):
    _kv_append.writes_in_place = real if in_place else (lambda dtype, ordered=False: False)
    caches = []
    for prompt in prompts if form == "batch" else prompts[:1]:
        cache = ragged_rows(make_prompt_cache(model))
        model(mx.array([prompt]), cache=cache)
        caches.append(cache)
    if form == "batch":
        cache = [RaggedBatchKVCache.merge([c[i] for c in caches]) for i in range(2)]
    else:
        (cache,) = caches
    tokens = mx.array([[11], [12], [13]][: len(caches)])
    out = []
    for _ in range(40):  # launched before the step before is read, as the engine decodes
        logits = model(tokens, cache=cache)
        mx.async_eval(logits)
        out.append(logits)
        tokens = (tokens * 7 + 1) % 96
    mx.eval(out)
    return out

for form in ("batch", "sequence"):
    want = life(False, form)
    before = len(writes)
    got = life(True, form)
    kinds = set(writes[before:])
    # under graphs the batch's writes are MLX's; the lone sequence's, the prelude's
    assert kinds == (set() if form == "batch" else {"prelude"}), kinds
    error = max(mx.abs(a - b).max().item() for a, b in zip(got, want))
    print(form, error)
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
