"""In-place KV writes under MLX's CUDA graphs (`_kv_append`'s docstring).

With graphs on, MLX orders a graph's kernels only by the arrays they declare, and the write
declares the buffers as read: a cache may then write in place only once its reader has shown
it takes the write's marker (`waited_for`), or where the writer's output is what the reader
reads (`ordered`, the decode prelude). The engine's attention takes the marker: its own
kernel as an input, any other reader through queries made after the write (`after_write`).
On the GPU, a batch and a lone sequence decoded in place under graphs give MLX's logits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlx_nursery.engine import _decode_attention, _kv_append
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
def test_under_graphs_a_cache_writes_in_place_once_its_reader_waits(
    graphs_on: list[int], kind: str
) -> None:
    cache: Any = (
        RaggedBatchKVCache.merge(rows([3, 5], 1, RowKVCache)) if kind == "batch" else RowKVCache()
    )
    count = 2 if kind == "batch" else 1
    k, v = mx.random.normal((2, count, HEADS, 1, DIM))
    if kind == "sequence":
        cache.update_and_fetch(k, v)  # its first write allocates the buffers (MLX's)
    cache.update_and_fetch(k, v)
    assert graphs_on == []  # a reader that never waited may run beside the write
    assert cache.write_slot(mx.float32, 1, ordered=True) is not None  # the prelude's case
    assert _kv_append.waited_for(cache) is None  # MLX's update: nothing to wait for
    cache.update_and_fetch(k, v)
    assert graphs_on == [1]
    marker = _kv_append.waited_for(cache)
    assert marker is not None and marker is cache.pending_write
    cache.trim(1)  # the next write is MLX's again, and leaves no marker behind
    cache.update_and_fetch(k, v)
    assert graphs_on == [1] and _kv_append.waited_for(cache) is None


def test_without_graphs_a_cache_writes_in_place_before_its_reader_waits(
    graphs_on: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_kv_append, "cuda_graphs_known_off", lambda: True)
    cache = RaggedBatchKVCache.merge(rows([3, 5], 1, RowKVCache))
    k, v = mx.random.normal((2, 2, HEADS, 1, DIM))
    cache.update_and_fetch(k, v)
    assert graphs_on == [1]


def test_the_engines_attention_reads_after_the_write(
    graphs_on: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader other than the ragged kernel gets queries made after the write: a kernel
    whose inputs are the queries and the marker (recorded here: it is CUDA's)."""
    waited: list[tuple[mx.array, mx.array | None]] = []

    def after(array: mx.array, marker: mx.array | None) -> mx.array:
        waited.append((array, marker))
        return array if marker is None else array + 0

    monkeypatch.setattr(_kv_append, "after_write", after)
    got: list[mx.array] = []

    def original(queries: mx.array, *_: Any, **__: Any) -> mx.array:
        got.append(queries)
        return queries

    attend = _decode_attention.routed(original, ragged=False, sequences=False)
    cache = RowKVCache()
    k, v = mx.random.normal((2, 1, HEADS, 1, DIM))
    queries = mx.zeros((1, HEADS, 1, DIM))
    for _ in range(3):
        keys, values = cache.update_and_fetch(k, v)
        attend(queries, keys, values, cache, 1.0, None)
    assert graphs_on == [1, 1]  # the first write allocates (MLX's), the reader then waits
    assert [m is None for _, m in waited] == [True, False, False]
    assert got[0] is queries and got[1] is not queries and got[2] is not queries
    assert waited[2][1] is cache.pending_write


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
append = _kv_append.append_in_place
def counted(*a):
    writes.append(1)
    return append(*a)
_kv_append.append_in_place = counted
prompts = [[5, 9, 2, 7, 1] * 40, [3, 8] * 70, [4, 4, 6, 1, 2, 9, 9, 3] * 30]

def life(in_place, form):
    _kv_append.writes_in_place = real if in_place else (lambda dtype, readers_wait=False: False)
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
    if form == "batch":
        assert len(writes) > before, "no write in place"
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
