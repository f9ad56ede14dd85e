"""Decode attention over a ragged batch on CUDA: each row reads only its own keys.

A running batch's rows start at different positions of one left-padded KV buffer
(`_ragged.RaggedBatchKVCache`), so mlx-lm passes MLX's attention a mask, and MLX's CUDA
backend has no fused kernel for a masked decode query: it falls back to separate
matrix-vector products, a select and a softmax over every row's whole padded length, which
measured most of a decode step's device time at 32 rows of ~1,000 tokens on an H100
(docs/benchmarks.md). This module's kernels (`mx.fast.cuda_kernel`, sources in
`_decode_kernels.py`) are flash decoding over ragged rows: for each row, key-value head and
slice of the row's keys, one block computes the scores of all the query heads that share the
key-value head (grouped-query attention reads each key once) in tiles of 32 keys, keeps an
online softmax, and writes the result; where a row's keys are split into several slices
(few rows: more blocks keep the device busy), a second kernel combines them. Rows' starts
are read on the device (the cache's `left_padding`), so nothing waits for the host.

`install(model)` routes the model's attention through `attend`: a single-token query on a
`RaggedBatchKVCache` with no attention sinks takes the kernel; a query of several tokens
(a prefill chunk, a verify) takes `_sequence_attention` where it serves (cuDNN attention
off); everything else (the fast path's decode, quantized KV, Metal, the CPU) calls mlx-lm's
own function unchanged. Engine thread only (the kernels are built on first use, per dtype
and head shape).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from ._backend import on_cuda
from ._decode_kernels import COMBINE, HEADER, PARTIAL, WHOLE
from ._own_kernels import CudaKernel
from ._ragged import RaggedBatchKVCache, read_from_row_starts
from ._scalars import scalar
from ._sequence_attention import same_layout, sequence_attention, takes
from ._upstream import mlx_lm_attention

_THREADS = 128
"""Threads per block: four warps, each taking tiles of 32 keys in turn."""

_WARPS = _THREADS // 32

_TARGET_BLOCKS = 128
"""Blocks to aim for (about one per streaming multiprocessor of an H100 or H200): a batch
whose rows and key-value heads make fewer blocks than this splits each row's keys into
slices (and combines them in a second kernel) so that the device stays busy; with as many
as this, a block takes a row's keys whole, in one kernel. More blocks cut the kernel's own
device time at 32 rows of an 8B model, but the served step ran slower with them (a second
kernel a layer, more host time): docs/benchmarks.md, decisions/0060."""

_VECTOR_VALUES = False
"""Whether a lane reads its share of a key's values in one load (consecutive dimensions)
rather than one load a dimension (dimensions 32 apart): a variant for
bench/ragged_attention.py (`--vector-values`) to measure before it is the default."""

_MIN_KEYS_PER_SLICE = 128
"""A slice holds at least one tile of 32 keys for each of the block's warps."""

_kernels: dict[str, CudaKernel] = {}


def available() -> bool:
    """The kernel runs here: MLX's default device is a CUDA GPU."""
    return on_cuda()


_INPUTS = ("q", "keys", "values", "start", "end", "scale")
_PARTIALS = ("partial_out", "partial_max", "partial_sum")
_KERNELS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str, str, bool]] = {
    "partial": (_INPUTS, _PARTIALS, PARTIAL, HEADER, False),
    "whole": (_INPUTS, ("out",), WHOLE, HEADER, False),
    "combine": (_PARTIALS, ("out",), COMBINE, "", True),
}
"""Per kernel: its inputs, outputs, source, header, and whether MLX copies its inputs to
row-contiguous first (the queries and the KV buffers are read through their strides)."""

COMPILED_BY_MLX = True
"""MLX compiles these kernels, not `_own_kernels` (decisions/0060): its compile of the same
source ran faster on the device, reads the queries through their strides where the engine's
call has MLX copy them first, and costs less host time a call; it costs seconds of compile
at each start instead (the warm-up builds both forms). bench/ sets it to measure both."""


def _kernel(name: str) -> CudaKernel:
    kernel = _kernels.get(name)
    if kernel is None:
        inputs, outputs, source, header, row_contiguous = _KERNELS[name]
        kernel = _kernels[name] = CudaKernel(
            name=f"nursery_ragged_decode_{name}",
            input_names=list(inputs),
            output_names=list(outputs),
            source=source,
            header=header,
            ensure_row_contiguous=row_contiguous,
            compile_here=not COMPILED_BY_MLX,
        )
    return kernel


SPLIT_KEYS = 2 * _MIN_KEYS_PER_SLICE
"""Keys a row from which a batch of few rows takes the two-kernel form (slices, then their
combination): the engine's warm-up runs a prompt this long, so that both forms are built
before a request needs them (the engine's kernels are compiled at each start, by
`_own_kernels` or by MLX)."""


def key_slices(rows: int, kv_heads: int, longest: int) -> int:
    """Slices each row's keys are split into, for `rows` rows of `kv_heads` key-value heads
    whose longest holds `longest` keys: 1 (the one-kernel form) unless few rows leave the
    device idle and the rows are long enough to split."""
    return max(
        1, min(math.ceil(_TARGET_BLOCKS / (rows * kv_heads)), longest // _MIN_KEYS_PER_SLICE)
    )


def ragged_decode_attention(queries: mx.array, cache: RaggedBatchKVCache, scale: float) -> mx.array:
    """Attention of one query token per row (`queries`: B, Hq, 1, D) over the rows' own keys
    in `cache` (after this step's update): rows' keys run from their left padding to the
    cache's write index. Lazy, as any MLX operation."""
    batch, heads, _, dim = queries.shape
    keys, values = cache.keys, cache.values
    if keys is None or values is None:
        raise ValueError("decode attention over a cache that holds no tokens")
    kv_heads = keys.shape[1]
    rep = heads // kv_heads
    splits = key_slices(batch, kv_heads, cache._idx - min(cache.padding))
    inputs = [
        queries,
        keys,
        values,
        cache.left_padding,
        scalar(cache._idx, mx.int32),
        scalar(scale, mx.float32),
    ]
    layout = [("REP", rep), ("D", dim), ("WARPS", _WARPS), ("VLOAD", _VECTOR_VALUES)]
    if splits == 1:  # one block a row and head: it writes the result itself
        (out,) = _kernel("whole")(
            inputs=inputs,
            template=[*layout, ("T", queries.dtype)],
            grid=(_THREADS, kv_heads, batch),
            threadgroup=(_THREADS, 1, 1),
            output_shapes=[(batch, heads, 1, dim)],
            output_dtypes=[queries.dtype],
        )
        result: mx.array = out
        return result
    partial_out, partial_max, partial_sum = _kernel("partial")(
        inputs=inputs,
        template=layout,
        grid=(splits * _THREADS, kv_heads, batch),
        threadgroup=(_THREADS, 1, 1),
        output_shapes=[(batch, heads, splits, dim), (batch, heads, splits), (batch, heads, splits)],
        output_dtypes=[mx.float32, mx.float32, mx.float32],
    )
    (out,) = _kernel("combine")(
        inputs=[partial_out, partial_max, partial_sum],
        template=[("T", queries.dtype), ("D", dim)],
        grid=(dim, heads, batch),
        threadgroup=(dim, 1, 1),
        output_shapes=[(batch, heads, 1, dim)],
        output_dtypes=[queries.dtype],
    )
    combined: mx.array = out
    return combined


Attention = Callable[..., mx.array]


def routed(original: Attention, *, ragged: bool = True, sequences: bool = True) -> Attention:
    """mlx-lm's `scaled_dot_product_attention`, with a ragged batch's decode step taken by
    `ragged_decode_attention` (if `ragged`) and a sequence's query of several tokens by
    `sequence_attention` (if `sequences`; module docstring)."""

    def attend(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: mx.array | None = None,
    ) -> mx.array:
        if (
            ragged
            and sinks is None
            and queries.shape[2] == 1
            and isinstance(cache, RaggedBatchKVCache)
            and queries.shape[-1] in (64, 96, 128)
            and same_layout(queries, keys, values, cache)
        ):
            return ragged_decode_attention(queries, cache, scale)
        if sequences and takes(queries, keys, values, cache, mask, sinks):
            return sequence_attention(queries, cache, scale, mask)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    attend.__wrapped__ = original  # type: ignore[attr-defined]
    return attend


def install(model: Any, *, ragged: bool = True, sequences: bool = True) -> bool:
    """Route `model`'s attention through the ragged decode kernel (if `ragged`) and the
    sequence attention (if `sequences`) where they serve (CUDA), by replacing
    `scaled_dot_product_attention` in the module that defines the model's layers (mlx-lm's
    model modules import it by name). Returns whether it did. Idempotent: the first
    install's choice stays (one process's engines load models of the same settings)."""
    if not available() or not (ragged or sequences):
        return False
    done = False
    for module_name in {type(m).__module__ for _, m in model.named_modules()}:
        module = sys.modules.get(module_name)
        current = getattr(module, "scaled_dot_product_attention", None)
        if current is mlx_lm_attention:
            module.scaled_dot_product_attention = routed(  # type: ignore[union-attr]
                current, ragged=ragged, sequences=sequences
            )
            done = True
        elif getattr(current, "__wrapped__", None) is mlx_lm_attention:
            done = True
    if done and ragged:
        read_from_row_starts()  # a batch's filter may leave padding the kernel never reads
    return done
