"""The residual add and the RMSNorm after it in one CUDA kernel, within and across blocks.

A Llama-shaped block (mlx-lm's llama, qwen2 and qwen3 `TransformerBlock`; Mistral is llama)
adds each sublayer's output to the residual stream and normalizes the sum for the next
sublayer, `h = x + r; n = rms_norm(h)`: two kernels, twice a layer (after the attention; and
after the MLP, where the next block's input norm follows). A decode step on CUDA is bound by
the host building and launching its kernels (docs/benchmarks.md), and one kernel for both
takes two launches a layer away. `install(model)` gives such blocks a subclass whose
`__call__` takes the kernel in both places: within the block, and across blocks: a block
leaves its MLP's output and its residual pending (`_Pending`, per engine thread), and the
next block, called on the sum they make (the same array), computes the sum and its input
norm in one kernel. The sum is still returned (lazily, `h + r`), for whatever else reads it
(the last block's to the model's final norm, a pipeline rank's to the next rank); an
unread one is never computed. The next block knows the sum by identity: a loop between
blocks must rebind what it changes (as mlx-lm's do), never change the array in place
(`+=` on an MLX array keeps the object).

Off unless `ENABLED` (`bench/step_anatomy.py --fused-norms`, `bench/batch_step.py
--fused-norms`): it serves once measured faster on the GPU. Each dtype and width is checked
once against MLX's add and RMSNorm before it serves; a mismatch or a failed build is logged
and MLX's two operations serve. CUDA only; engine thread only.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import attrs
import mlx.core as mx

from ._backend import on_cuda
from ._own_kernels import CudaKernel
from ._scalars import scalar

log = logging.getLogger("mlx_nursery.engine")

ENABLED = False
"""Whether `install` serves blocks: off until measured on the GPU (module docstring)."""

BLOCKS = frozenset(f"mlx_lm.models.{name}" for name in ("llama", "qwen2", "qwen3"))
"""mlx-lm modules whose `TransformerBlock.__call__` is `x + attn(input_norm(x))`, then that
plus `mlp(post_norm(...))` (mlx-lm 0.32.2)."""

_WARPS = 4
"""Rows a block of threads: a warp takes a row."""

_SOURCE = """
    // One warp per row of D elements: h = x + r, rounded to T as MLX's add gives it, and
    // out = w * T(h * rsqrt(mean(h^2) + eps)) as MLX's rms_norm computes it. Each lane takes
    // VEC contiguous elements at a time; the sum of squares is the warp's.
    const int lane = threadIdx.x % 32;
    const long row = (long)blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= x_shape[0]) {
        return;  // a whole warp at once: nothing below waits for the block
    }
    const T* xs = x + row * D;
    const T* rs = r + row * D;
    T* hs = h + row * D;
    T* os = out + row * D;
    float sum = 0.0f;
    for (int j0 = lane * VEC; j0 < D; j0 += 32 * VEC) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            const T v = nursery_sum<T>(xs[j0 + i], rs[j0 + i]);
            hs[j0 + i] = v;
            const float f = static_cast<float>(v);
            sum += f * f;
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        sum += __shfl_xor_sync(0xffffffff, sum, offset);
    }
    const float normalizer = rsqrtf(sum / D + eps[0]);
    for (int j0 = lane * VEC; j0 < D; j0 += 32 * VEC) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            const T v = nursery_sum<T>(xs[j0 + i], rs[j0 + i]);
            const T y = static_cast<T>(static_cast<float>(v) * normalizer);
            os[j0 + i] = static_cast<T>(static_cast<float>(w[j0 + i]) * static_cast<float>(y));
        }
    }
"""

_HEADER = """
template <typename T>
__device__ __forceinline__ T nursery_sum(T a, T b) {
    return static_cast<T>(static_cast<float>(a) + static_cast<float>(b));
}
"""

_kernel = CudaKernel(
    name="nursery_add_rms_norm",
    input_names=["x", "r", "w", "eps"],
    output_names=["h", "out"],
    source=_SOURCE,
    header=_HEADER,
)


def add_rms_norm(x: mx.array, r: mx.array, norm: Any) -> tuple[mx.array, mx.array]:
    """`x + r` and `norm` (an `nn.RMSNorm`) of it: by the kernel where it serves this dtype
    and width, else MLX's add and RMSNorm. Lazy, as any MLX operation; the first call of a
    dtype and width on CUDA checks the kernel (blocking, once)."""
    width = x.shape[-1]
    if (
        x.size
        and x.dtype == r.dtype == norm.weight.dtype
        and x.shape == r.shape
        and usable(x.dtype, width)
    ):
        rows = x.size // width
        flat = (rows, width)
        h, out = _run(x.reshape(flat), r.reshape(flat), norm.weight, norm.eps)
        return h.reshape(x.shape), out.reshape(x.shape)
    h = x + r
    return h, norm(h)


def _run(x: mx.array, r: mx.array, weight: mx.array, eps: float) -> tuple[mx.array, mx.array]:
    rows, width = x.shape
    h, out = _kernel(
        inputs=[x, r, weight, scalar(eps, mx.float32)],
        template=[("T", x.dtype), ("D", width), ("VEC", 16 // x.dtype.size), ("WARPS", _WARPS)],
        grid=(-(-rows // _WARPS) * _WARPS * 32, 1, 1),
        threadgroup=(_WARPS * 32, 1, 1),
        output_shapes=[x.shape, x.shape],
        output_dtypes=[x.dtype, x.dtype],
    )
    return h, out


_checked: dict[tuple[mx.Dtype, int], bool] = {}


def usable(dtype: mx.Dtype, width: int) -> bool:
    """Whether the kernel serves rows of `width` elements of `dtype` here: CUDA, a width of
    whole 16-byte runs (a lane's `VEC` elements), and on first use a check against MLX's add
    and RMSNorm (blocking, once per dtype and width; a mismatch or a failed build is logged
    and refused)."""
    if dtype not in (mx.bfloat16, mx.float16, mx.float32) or width % (16 // dtype.size):
        return False
    key = (dtype, width)
    checked = _checked.get(key)
    if checked is None:
        checked = _checked[key] = on_cuda() and _self_check(dtype, width)
    return checked


def _self_check(dtype: mx.Dtype, width: int) -> bool:
    try:
        keys = mx.random.split(mx.random.key(width), 3)
        x, r, w = (mx.random.normal((5, width), key=k).astype(dtype) for k in keys)
        h, out = _run(x, r, w, 1e-5)
        want_h = x + r
        want = mx.fast.rms_norm(want_h, w, 1e-5)
        tolerance = 1e-5 if dtype == mx.float32 else 2e-2
        matches = bool(mx.array_equal(h, want_h)) and bool(
            mx.allclose(
                out.astype(mx.float32), want.astype(mx.float32), atol=tolerance, rtol=tolerance
            )
        )
    except Exception:
        log.exception(
            "the fused add and RMSNorm failed its check (%s, %d): MLX's serve", dtype, width
        )
        return False
    if not matches:
        log.warning(
            "the fused add and RMSNorm differs from MLX's (%s, %d): MLX's serve", dtype, width
        )
    return matches


@attrs.frozen(eq=False)
class _Pending:
    """A block's output (`total`, the lazy sum) and the two arrays it is the sum of."""

    total: mx.array
    residual: mx.array
    update: mx.array


class _Thread(threading.local):
    pending: _Pending | None = None


_thread = _Thread()


def _call(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    """mlx-lm's `TransformerBlock.__call__` with each add and the norm after it in one
    kernel (module docstring)."""
    pending, _thread.pending = _thread.pending, None
    if pending is not None and pending.total is x:
        x, normed = add_rms_norm(pending.residual, pending.update, self.input_layernorm)
    else:
        normed = self.input_layernorm(x)
    r = self.self_attn(normed, mask, cache)
    h, normed = add_rms_norm(x, r, self.post_attention_layernorm)
    r = self.mlp(normed)
    out: mx.array = h + r
    if not self._nursery_last:
        _thread.pending = _Pending(out, h, r)
    return out


_classes: dict[type, type] = {}


def _served_class(base: type) -> type:
    served = _classes.get(base)
    if served is None:
        served = _classes[base] = type(
            base.__name__, (base,), {"__call__": _call, "__module__": base.__module__}
        )
    return served


def install(model: Any, *, anywhere: bool = False) -> int:
    """Give `model`'s blocks that this serves the fused path (where `ENABLED`, on CUDA;
    `anywhere`: on any device, for tests, where MLX's two operations stand in for the
    kernel); returns how many. Idempotent."""
    if not ENABLED or not (anywhere or on_cuda()):
        return 0
    body = getattr(model, "model", None)
    layers = getattr(body, "pipeline_layers", getattr(body, "layers", None))
    if not isinstance(layers, list) or not layers:
        return 0
    serves = [_serves(block) for block in layers]
    for i, block in enumerate(layers):
        if not serves[i]:
            continue
        # the last, or followed by a block that takes no pending sum: leave none
        block._nursery_last = i + 1 == len(layers) or not serves[i + 1]
        if type(block) not in _classes.values():
            block.__class__ = _served_class(type(block))
    return sum(serves)


def _serves(block: Any) -> bool:
    """`block` is (or was, before `install`) one of `BLOCKS`' own `TransformerBlock`."""
    kind = type(block)
    base = kind.__mro__[1] if kind in _classes.values() else kind
    return base.__module__ in BLOCKS and base is getattr(
        sys.modules[base.__module__], "TransformerBlock", None
    )
