"""Decode attention over a ragged batch on CUDA: each row reads only its own keys.

A running batch's rows start at different positions of one left-padded KV buffer
(`_ragged.RaggedBatchKVCache`), so mlx-lm passes MLX's attention a mask, and MLX's CUDA
backend has no fused kernel for a masked decode query: it falls back to separate
matrix-vector products, a select and a softmax over every row's whole padded length, which
measured most of a decode step's device time at 32 rows of ~1,000 tokens on an H100
(docs/benchmarks.md). This module's kernel (`mx.fast.cuda_kernel`) is flash decoding over
ragged rows: for each row, key-value head and slice of the row's keys, one block computes
the scores of all the query heads that share the key-value head (grouped-query attention
reads each key once), keeps an online softmax, and writes a partial result; a second kernel
combines the slices. Rows' starts are read on the device (the cache's `left_padding`), so
nothing waits for the host.

`install(model)` routes the model's attention through `attend`: a single-token query on a
`RaggedBatchKVCache` with no attention sinks takes the kernel; everything else (prefill,
the fast path, quantized KV, Metal, the CPU) calls mlx-lm's own function unchanged. Engine
thread only (the kernels are built on first use, per dtype and head shape).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from ._ragged import RaggedBatchKVCache
from ._upstream import mlx_lm_attention

_THREADS = 128
"""Threads per block: four warps, each taking every fourth key of the block's slice."""

_WARPS = _THREADS // 32

_TARGET_BLOCKS = 264
"""Blocks to aim for (two per streaming multiprocessor of an H100): a batch with few rows
splits each row's keys into more slices so that the device stays busy."""

_MIN_KEYS_PER_SLICE = 128

_PARTIAL = """
    const float NEG_INF = __int_as_float(0xff800000);
    const int split = blockIdx.x;
    const int kv_head = blockIdx.y;
    const int row = blockIdx.z;
    const int splits = gridDim.x;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    constexpr int E = D / 32;

    const int first = start[row];
    const int last = end[0];
    const int total = last > first ? last - first : 0;
    const int per_split = (total + splits - 1) / splits;
    const int lo = first + split * per_split;
    const int hi = min(last, lo + per_split);
    const float scale_value = scale[0];

    float qv[REP][E];
    float m[REP];
    float l[REP];
    float acc[REP][E];
    for (int r = 0; r < REP; ++r) {
        const int head = kv_head * REP + r;
        for (int e = 0; e < E; ++e) {
            const int d = e * 32 + lane;
            qv[r][e] = static_cast<float>(
                q[row * q_strides[0] + head * q_strides[1] + d * q_strides[3]]) * scale_value;
            acc[r][e] = 0.0f;
        }
        m[r] = NEG_INF;
        l[r] = 0.0f;
    }

    const auto* k_base = keys + row * keys_strides[0] + kv_head * keys_strides[1];
    const auto* v_base = values + row * values_strides[0] + kv_head * values_strides[1];
    for (int k = lo + warp; k < hi; k += WARPS) {
        float kv[E];
        float vv[E];
        for (int e = 0; e < E; ++e) {
            const int d = e * 32 + lane;
            kv[e] = static_cast<float>(k_base[k * keys_strides[2] + d * keys_strides[3]]);
            vv[e] = static_cast<float>(v_base[k * values_strides[2] + d * values_strides[3]]);
        }
        for (int r = 0; r < REP; ++r) {
            float s = 0.0f;
            for (int e = 0; e < E; ++e) {
                s += qv[r][e] * kv[e];
            }
            for (int offset = 16; offset > 0; offset /= 2) {
                s += __shfl_xor_sync(0xffffffff, s, offset);
            }
            const float m_new = fmaxf(m[r], s);
            const float correction = __expf(m[r] - m_new);
            const float p = __expf(s - m_new);
            l[r] = l[r] * correction + p;
            for (int e = 0; e < E; ++e) {
                acc[r][e] = acc[r][e] * correction + p * vv[e];
            }
            m[r] = m_new;
        }
    }

    __shared__ float shared_m[WARPS][REP];
    __shared__ float shared_l[WARPS][REP];
    __shared__ float shared_acc[WARPS][REP][D];
    for (int r = 0; r < REP; ++r) {
        if (lane == 0) {
            shared_m[warp][r] = m[r];
            shared_l[warp][r] = l[r];
        }
        for (int e = 0; e < E; ++e) {
            shared_acc[warp][r][e * 32 + lane] = acc[r][e];
        }
    }
    __syncthreads();

    // Every thread combines the warps for some (head, dimension) pairs of the block.
    for (int i = threadIdx.x; i < REP * D; i += blockDim.x) {
        const int r = i / D;
        const int d = i % D;
        float top = NEG_INF;
        for (int w = 0; w < WARPS; ++w) {
            top = fmaxf(top, shared_m[w][r]);
        }
        float sum = 0.0f;
        float out = 0.0f;
        if (top != NEG_INF) {
            for (int w = 0; w < WARPS; ++w) {
                const float weight = __expf(shared_m[w][r] - top);
                sum += shared_l[w][r] * weight;
                out += shared_acc[w][r][d] * weight;
            }
        }
        const int head = kv_head * REP + r;
        const long slot = ((long)row * (gridDim.y * REP) + head) * splits + split;
        partial_out[slot * D + d] = out;
        if (d == 0) {
            partial_max[slot] = top;
            partial_sum[slot] = sum;
        }
    }
"""

_COMBINE = """
    const float NEG_INF = __int_as_float(0xff800000);
    const int d = threadIdx.x;
    const int head = blockIdx.y;
    const int row = blockIdx.z;
    const int heads = gridDim.y;
    const int splits = partial_max_shape[2];
    const long base = ((long)row * heads + head) * splits;
    float top = NEG_INF;
    for (int s = 0; s < splits; ++s) {
        top = fmaxf(top, partial_max[base + s]);
    }
    float sum = 0.0f;
    float value = 0.0f;
    if (top != NEG_INF) {
        for (int s = 0; s < splits; ++s) {
            const float weight = __expf(partial_max[base + s] - top);
            sum += partial_sum[base + s] * weight;
            value += partial_out[(base + s) * D + d] * weight;
        }
    }
    out[((long)row * heads + head) * D + d] = static_cast<T>(sum > 0.0f ? value / sum : 0.0f);
"""

_kernels: dict[str, Any] = {}


def available() -> bool:
    """The kernel runs here: MLX's default device is a CUDA GPU."""
    if mx.default_device().type != mx.DeviceType.gpu:
        return False
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


def _kernel(name: str) -> Any:
    kernel = _kernels.get(name)
    if kernel is None:
        if name == "partial":
            kernel = mx.fast.cuda_kernel(
                name="nursery_ragged_decode_partial",
                input_names=["q", "keys", "values", "start", "end", "scale"],
                output_names=["partial_out", "partial_max", "partial_sum"],
                source=_PARTIAL,
                ensure_row_contiguous=False,
            )
        else:
            kernel = mx.fast.cuda_kernel(
                name="nursery_ragged_decode_combine",
                input_names=["partial_out", "partial_max", "partial_sum"],
                output_names=["out"],
                source=_COMBINE,
            )
        _kernels[name] = kernel
    return kernel


def ragged_decode_attention(queries: mx.array, cache: RaggedBatchKVCache, scale: float) -> mx.array:
    """Attention of one query token per row (`queries`: B, Hq, 1, D) over the rows' own keys
    in `cache` (after this step's update): rows' keys run from their left padding to the
    cache's write index. Lazy, as any MLX operation."""
    batch, heads, _, dim = queries.shape
    if cache.keys is None:
        raise ValueError("decode attention over a cache that holds no tokens")
    kv_heads = cache.keys.shape[1]
    rep = heads // kv_heads
    longest = cache._idx - min(cache.padding)
    splits = max(
        1, min(math.ceil(_TARGET_BLOCKS / (batch * kv_heads)), longest // _MIN_KEYS_PER_SLICE)
    )
    partial_out, partial_max, partial_sum = _kernel("partial")(
        inputs=[
            queries,
            cache.keys,
            cache.values,
            cache.left_padding,
            _scalar(cache._idx, mx.int32),
            _scalar(scale, mx.float32),
        ],
        template=[("REP", rep), ("D", dim), ("WARPS", _WARPS)],
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
    result: mx.array = out
    return result


_scalars: dict[tuple[float, mx.Dtype], mx.array] = {}


def _scalar(value: float, dtype: mx.Dtype) -> mx.array:
    """`value` as a one-element array, made once: every layer of a step passes the same
    write index and scale, and each new array costs the host an allocation and a copy."""
    key = (value, dtype)
    array = _scalars.get(key)
    if array is None:
        if len(_scalars) > 64:  # write indexes move on: keep only the recent ones
            _scalars.clear()
        array = _scalars[key] = mx.array([value], dtype=dtype)
    return array


Attention = Callable[..., mx.array]


def routed(original: Attention) -> Attention:
    """mlx-lm's `scaled_dot_product_attention`, with a ragged batch's decode step taken by
    `ragged_decode_attention` (module docstring)."""

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
            sinks is None
            and queries.shape[2] == 1
            and isinstance(cache, RaggedBatchKVCache)
            and cache.keys is not None
            and queries.shape[-1] in (64, 96, 128)
            and queries.shape[1] % cache.keys.shape[1] == 0
        ):
            return ragged_decode_attention(queries, cache, scale)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    attend.__wrapped__ = original  # type: ignore[attr-defined]
    return attend


def install(model: Any) -> bool:
    """Route `model`'s attention through the ragged decode kernel where it runs (CUDA), by
    replacing `scaled_dot_product_attention` in the module that defines the model's layers
    (mlx-lm's model modules import it by name). Returns whether it did. Idempotent."""
    if not available():
        return False
    done = False
    for module_name in {type(m).__module__ for _, m in model.named_modules()}:
        module = sys.modules.get(module_name)
        current = getattr(module, "scaled_dot_product_attention", None)
        if current is mlx_lm_attention:
            module.scaled_dot_product_attention = routed(current)  # type: ignore[union-attr]
            done = True
        elif getattr(current, "__wrapped__", None) is mlx_lm_attention:
            done = True
    return done
