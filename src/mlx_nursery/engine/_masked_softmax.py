"""The softmax of a query's attention scores under its mask, in one CUDA kernel.

`_sequence_attention` lays a query of several tokens out for cuBLAS, but between its two
products MLX needs two passes over the scores, each slower than the memory allows: a select
under a mask broadcast over the heads (a general strided kernel) and a softmax, which took
most of a long prefill chunk's attention where the two products took little (measured in
docs/benchmarks.md, decisions/0054). This kernel does both in one: a warp per row of
scores reads the row (the keys it may see, by the causal rule or the batch's boolean mask;
16 bytes a lane at a time where the row's length allows) for its scaled maximum and sum in
one online pass, then writes the probabilities, zero where hidden. The scale is applied here,
to the float32 score, so the query is not multiplied beforehand.

CUDA only (`mx.fast.cuda_kernel`); built on first use per dtype and mode. Engine thread
only, as every MLX call of a model.
"""

from __future__ import annotations

import logging

import mlx.core as mx

from ._own_kernels import CudaKernel

log = logging.getLogger("mlx_nursery.engine")

_WARPS = 8
"""Rows a block: a warp takes a row, so a short row (a chunk over a few hundred keys) does
not leave most of a block idle, and no reduction needs the whole block."""

_HEADER = """
template <int N, typename T>
__device__ __forceinline__ void nursery_softmax_load(const T* source, float* target) {
    // N elements of T as floats: one 16-byte load where N of them fill it.
    if (N * sizeof(T) == 16) {
        const uint4 raw = *reinterpret_cast<const uint4*>(source);
        const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < N; ++i) {
            target[i] = static_cast<float>(values[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            target[i] = static_cast<float>(source[i]);
        }
    }
}

template <int N, typename T>
__device__ __forceinline__ void nursery_softmax_store(T* target, const float* source) {
    if (N * sizeof(T) == 16) {
        uint4 raw;
        T* values = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int i = 0; i < N; ++i) {
            values[i] = static_cast<T>(source[i]);
        }
        *reinterpret_cast<uint4*>(target) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            target[i] = static_cast<T>(source[i]);
        }
    }
}
"""

_SOURCE = """
    // One warp per row of scores (B, H, L, P), WARPS rows a block: the row's visible keys
    // get softmax(scale * score), the rest 0. Each lane takes VEC keys at a time.
    const float NEG_INF = __int_as_float(0xff800000);
    const int lane = threadIdx.x % 32;
    const long row = (long)blockIdx.x * WARPS + threadIdx.x / 32;
    const int P = scores_shape[3];
    const int L = scores_shape[2];
    const int H = scores_shape[1];
    if (row >= (long)scores_shape[0] * H * L) {
        return;  // a whole warp at once: nothing below waits for the block
    }
    const int l = row % L;
    const float sc = scale[0];
    BOUNDS
    const auto* in = scores + row * P;
    auto* o = out + row * P;

    float m = NEG_INF;
    float s = 0.0f;
    for (int j0 = lane * VEC; j0 < hi; j0 += 32 * VEC) {
        float x[VEC];
        nursery_softmax_load<VEC>(in + j0, x);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            if (VISIBLE) {
                const float v = x[i] * sc;
                if (v > m) {
                    s = s * __expf(m - v) + 1.0f;
                    m = v;
                } else {
                    s += __expf(v - m);
                }
            }
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        const float m2 = __shfl_xor_sync(0xffffffff, m, offset);
        const float s2 = __shfl_xor_sync(0xffffffff, s, offset);
        const float top = fmaxf(m, m2);
        s = top == NEG_INF ? 0.0f : s * __expf(m - top) + s2 * __expf(m2 - top);
        m = top;
    }
    const float inverse = s > 0.0f ? 1.0f / s : 0.0f;
    for (int j0 = lane * VEC; j0 < P; j0 += 32 * VEC) {
        float y[VEC];
        if (j0 < hi) {
            nursery_softmax_load<VEC>(in + j0, y);
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                y[i] = VISIBLE ? __expf(y[i] * sc - m) * inverse : 0.0f;
            }
        } else {
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                y[i] = 0.0f;
            }
        }
        nursery_softmax_store<VEC>(o + j0, y);
    }
"""

_CAUSAL = (
    "const int hi = min(P, total[0] - L + l + 1);",
    "(j0 + i < hi)",
)
"""The last L of `total` keys are the queries': query l sees keys up to its own."""

_MASKED = (
    """const long b = row / ((long)L * H);
    const int S = mask_shape[2];
    const int hi = min(P, S);
    const bool* visible_row = mask + (b * L + l) * S;""",
    "(j0 + i < hi && visible_row[j0 + i])",
)
"""mlx-lm's boolean mask (B, L, S) says which keys each query sees; keys past S none."""

_kernels: dict[bool, CudaKernel] = {}


def _kernel(causal: bool) -> CudaKernel:
    kernel = _kernels.get(causal)
    if kernel is None:
        inputs = ["scores", "scale", "total"] if causal else ["scores", "scale", "mask"]
        bounds, visible = _CAUSAL if causal else _MASKED
        kernel = _kernels[causal] = CudaKernel(
            name=f"nursery_masked_softmax_{'causal' if causal else 'mask'}",
            input_names=inputs,
            output_names=["out"],
            source=_SOURCE.replace("BOUNDS", bounds).replace("VISIBLE", visible),
            header=_HEADER,
        )
    return kernel


def masked_softmax(
    scores: mx.array,
    scale: mx.array,
    *,
    total: mx.array | None = None,
    mask: mx.array | None = None,
) -> mx.array:
    """softmax(`scale` * `scores`) over the last axis of `scores` (B, H, L, P: unscaled, row
    contiguous), each row over the keys its query sees: causal with `total` (a one-element
    int32 array: the keys written, the last L of them the queries'), or the keys `mask`
    (B, L, S) marks, S <= P; hidden keys get 0. `scale` is a one-element float32 array.
    Lazy, as any MLX operation."""
    batch, heads, length, keys = scores.shape
    causal = mask is None
    extra = total if causal else mask
    if extra is None:
        raise ValueError("a causal softmax needs `total`")
    vector = 16 // scores.dtype.size
    rows = batch * heads * length
    (out,) = _kernel(causal)(
        inputs=[scores, scale, extra],
        template=[
            ("T", scores.dtype),
            ("VEC", vector if keys % vector == 0 else 1),
            ("WARPS", _WARPS),
        ],
        grid=(-(-rows // _WARPS) * _WARPS * 32, 1, 1),
        threadgroup=(_WARPS * 32, 1, 1),
        output_shapes=[scores.shape],
        output_dtypes=[scores.dtype],
    )
    result: mx.array = out
    return result


_checked: dict[mx.Dtype, bool] = {}


def usable(dtype: mx.Dtype) -> bool:
    """Whether the kernel serves scores of `dtype` here: on its first use per dtype (the
    engine's warm-up, before ready) every variant it builds (causal and masked, with and
    without 16-byte loads) runs once on small rows against MLX's softmax. A variant that
    fails to build or to match is logged and the sequence attention takes MLX's select and
    softmax instead, rather than failing requests. Blocks for that check, once per dtype."""
    checked = _checked.get(dtype)
    if checked is None:
        checked = _checked[dtype] = _self_check(dtype)
    return checked


def _self_check(dtype: mx.Dtype) -> bool:
    vector = 16 // dtype.size
    try:
        for keys in (2 * vector, 2 * vector + 1):  # 16-byte loads, then one element a time
            length = 3
            scores = mx.random.normal((1, 2, length, keys), key=mx.random.key(keys)).astype(dtype)
            scale = mx.array([0.5], dtype=mx.float32)
            written = keys - 1  # the last key is padding: hidden from every row
            seen = mx.arange(keys)[None, :] <= mx.arange(written - length, written)[:, None]
            hidden_first = mx.arange(written)[None, None, :] >= 1  # a row's left padding
            mask = seen[None, :, :written] & hidden_first
            for got, visible in (
                (masked_softmax(scores, scale, total=mx.array([written], mx.int32)), seen),
                (masked_softmax(scores, scale, mask=mask), mx.pad(mask, [(0, 0), (0, 0), (0, 1)])),
            ):
                logits = mx.where(visible, scores.astype(mx.float32) * 0.5, -mx.inf)
                want = mx.softmax(logits, axis=-1)
                if not mx.allclose(got.astype(mx.float32), want, atol=1e-2).item():
                    raise ValueError(f"differs from MLX's softmax by {mx.abs(got - want).max()}")
    except Exception:  # any failure: MLX's select and softmax serve instead
        log.warning(
            "masked softmax kernel unusable for %s; MLX's softmax serves", dtype, exc_info=True
        )
        return False
    return True
