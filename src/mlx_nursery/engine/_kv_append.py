"""New keys and values written into a batch's KV buffers in place, on CUDA.

mlx-lm writes a step's keys into its cache with a slice update (`keys[..., i:j, :] = new`),
which MLX performs in place only when it may donate the buffer: when nothing else holds it.
But the kernels of the step before, which read the same buffer, hold it until the device has
run them (MLX keeps a launched kernel's inputs alive until its command buffer completes), so
whenever the host builds step N+1 while step N still runs (the engine launches each step
before it reads the previous one's tokens), MLX copies every layer's whole buffer to add one
token: a device-wide read and write of the batch's KV, and a fresh allocation of its size,
for each layer, each step. The busier the device, the more steps pay it.

`append_in_place` instead launches a kernel that writes the new keys and values straight
into the buffers at the write index, and returns a one-element array that stands for the
write; the cache then makes its buffers depend on it (`mx.depends`), so that everything
reading them after is launched after the write. This is safe because the kernels run in
launch order on one stream, and because the cache only ever writes at its write index and
beyond, positions no lazy reader of its older arrays covers (a reader made before the write
reads up to the write index of its time; where the index moves back, `trim`, and where the
buffers came from elsewhere, `state`, the next write is MLX's own). It is not safe where
MLX orders kernels by the buffers they declare (CUDA graphs, Metal's concurrent encoders):
there a kernel that writes a buffer it declares as read may run beside its readers, which
are many (the attention, a padded chunk's realignment, a batch's joins and filters, models
that read their keys themselves). So `writes_in_place` holds only on CUDA with CUDA graphs
off (the engine's default, `EngineConfig.cuda_graphs`), or for an `ordered` writer: one
whose output every reader of the buffers in the write's evaluation consumes, and which
takes the cache's previous write as an input (`_decode_prelude`, whose output is the
queries: decisions/0059); elsewhere the cache updates as mlx-lm does, and an update of
MLX's first commits a pending write (`settle`): MLX's update reads the buffers and takes
no marker. Under graphs that holds only where the attention is the buffers' one reader
within a step, as on the fast path. Engine thread only (the kernel is built on first use,
per dtype).
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx

from ._backend import cuda_graphs_known_off, on_cuda
from ._scalars import scalar

log = logging.getLogger("mlx_nursery.engine")

APPEND = """
    // One thread an element: of the new keys (B, H, L, DK), then of the new values
    // (B, H, L, DV), written at position `index` + l of the buffers, read and written
    // through their strides. The buffers are declared as inputs: they are written in
    // place (the module's docstring says why that is safe).
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long heads = new_keys_shape[1];
    const long long length = new_keys_shape[2];
    const long long key_dim = new_keys_shape[3];
    const long long value_dim = new_values_shape[3];
    const long long key_count = new_keys_shape[0] * heads * length * key_dim;
    const long long value_count = new_values_shape[0] * heads * length * value_dim;
    const long long position = index[0];
    if (i == 0) {
        done[0] = 0;
    }
    if (i < key_count) {
        const long long d = i % key_dim;
        const long long l = (i / key_dim) % length;
        const long long h = (i / (key_dim * length)) % heads;
        const long long b = i / (key_dim * length * heads);
        T* target = const_cast<T*>(keys);
        target[b * keys_strides[0] + h * keys_strides[1] + (position + l) * keys_strides[2]
               + d * keys_strides[3]] = static_cast<T>(
            new_keys[b * new_keys_strides[0] + h * new_keys_strides[1]
                     + l * new_keys_strides[2] + d * new_keys_strides[3]]);
    } else if (i < key_count + value_count) {
        const long long j = i - key_count;
        const long long d = j % value_dim;
        const long long l = (j / value_dim) % length;
        const long long h = (j / (value_dim * length)) % heads;
        const long long b = j / (value_dim * length * heads);
        T* target = const_cast<T*>(values);
        target[b * values_strides[0] + h * values_strides[1]
               + (position + l) * values_strides[2] + d * values_strides[3]] = static_cast<T>(
            new_values[b * new_values_strides[0] + h * new_values_strides[1]
                       + l * new_values_strides[2] + d * new_values_strides[3]]);
    }
"""

_THREADS = 256

_kernel: list[Any] = []


def writes_in_place(dtype: mx.Dtype, *, ordered: bool = False) -> bool:
    """The cache may write new keys and values of `dtype` in place here: MLX runs on CUDA,
    and either the writer is `ordered` (the module's docstring says which: it writes with a
    kernel and a check of its own) or CUDA graphs are known off
    (`_backend.cuda_graphs_known_off`) and this module's kernel passed its check for `dtype`
    (`usable`). Engine thread, after `_backend.prepare_backend`; blocks for the
    check on a dtype's first use."""
    return on_cuda() and (ordered or (cuda_graphs_known_off() and usable(dtype)))


def kept(marker: mx.array) -> mx.array | None:
    """What a cache keeps of its latest in-place write (`pending_write`): the marker where
    CUDA graphs may be on (the next ordered write takes it, an update of MLX's commits it
    first), nothing where they are known off (launch order is enough, and a stored cache
    would hold the marker, a step's queries for the prelude, for nothing)."""
    return None if cuda_graphs_known_off() else marker


def settle(marker: mx.array | None) -> None:
    """Commit the in-place write `marker` stands for before anything else is encoded, where
    CUDA graphs may be on: a graph orders kernels only by the arrays they declare, but
    graphs run one after another. Called before an update of MLX's reads the buffers. A
    no-op with graphs known off, without a marker, or where it was committed already."""
    if marker is not None and not cuda_graphs_known_off():
        mx.async_eval(marker)  # type: ignore[no-untyped-call]


def append_in_place(
    keys: mx.array, values: mx.array, new_keys: mx.array, new_values: mx.array, index: int
) -> mx.array:
    """Write `new_keys` and `new_values` (B, H, L, D) into the buffers `keys` and `values`
    (B, H, capacity, D) at positions `index` to `index + L`, in place; returns a lazy
    one-element array that stands for the write: whatever reads the buffers after must
    depend on it (`mx.depends`). The caller owns the buffers (nothing else may read those
    positions) and has checked `writes_in_place`. Lazy, as any MLX operation; raises where
    MLX cannot build the kernel (not CUDA) when it is evaluated or before."""
    if index + new_keys.shape[2] > keys.shape[2] or keys.shape[2] != values.shape[2]:
        raise ValueError("the new keys do not fit the buffers at the write index")
    if not _kernel:
        _kernel.append(
            mx.fast.cuda_kernel(
                name="nursery_kv_append",
                input_names=["keys", "values", "new_keys", "new_values", "index"],
                output_names=["done"],
                source=APPEND,
                ensure_row_contiguous=False,
            )
        )
    elements = new_keys.size + new_values.size
    (done,) = _kernel[0](
        inputs=[keys, values, new_keys, new_values, scalar(index, mx.int64)],
        template=[("T", keys.dtype)],
        grid=(max(elements, 1), 1, 1),
        threadgroup=(_THREADS, 1, 1),
        output_shapes=[(1,)],
        output_dtypes=[mx.int32],
    )
    marker: mx.array = done
    return marker


_checked: dict[mx.Dtype, bool] = {}


def usable(dtype: mx.Dtype) -> bool:
    """Whether the kernel writes what MLX's slice update writes for `dtype`: checked once per
    dtype on small buffers (the engine's warm-up meets it first). A kernel that fails to build
    or to match is logged and the cache keeps MLX's updates, rather than failing requests.
    Blocks for the check, once per dtype."""
    checked = _checked.get(dtype)
    if checked is None:
        checked = _checked[dtype] = _self_check(dtype)
    return checked


def _self_check(dtype: mx.Dtype) -> bool:
    shape, written = (2, 2, 16, 8), (2, 2, 3, 8)
    try:
        keys, values = mx.zeros(shape, dtype), mx.ones(shape, dtype)
        new_keys = mx.random.normal(written, key=mx.random.key(1)).astype(dtype)
        new_values = mx.random.normal(written, key=mx.random.key(2)).astype(dtype)
        done = append_in_place(keys, values, new_keys, new_values, 5)
        mx.eval(done)  # run before the comparison is encoded: under CUDA graphs too
        keys, values = mx.depends([keys, values], [done])
        want_keys, want_values = mx.zeros(shape, dtype), mx.ones(shape, dtype)
        want_keys[:, :, 5:8] = new_keys
        want_values[:, :, 5:8] = new_values
        if not (
            mx.array_equal(keys, want_keys).item() and mx.array_equal(values, want_values).item()
        ):
            raise ValueError("the in-place write differs from MLX's slice update")
    except Exception:  # any failure: MLX's updates serve
        log.warning("in-place KV write unusable for %s; MLX's updates serve", dtype, exc_info=True)
        return False
    return True
