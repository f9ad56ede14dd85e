"""A decode step's query, key and value heads made ready by one kernel, on CUDA.

Between a layer's fused q/k/v projection (`models/_fusing.py`) and its attention, mlx-lm
slices the product into queries, keys and values, rotates the queries and the keys (RoPE,
a kernel each), writes the keys and values into the cache (`_kv_append`'s kernel, or MLX's
slice updates), and the ragged decode attention (`_decode_attention.py`) copies the rotated
queries, which RoPE leaves strided like the product, to a contiguous array: four kernels a
layer, and a dozen operations of Python graph building, for a step whose time on CUDA is the
host's building and launching of its kernels (issue 32, decisions/0058). Here one kernel
reads the product, writes the rotated queries (contiguous) and writes the rotated keys and
the values into the cache's buffers in place, as `_kv_append` does and under its rules (the
caches' `write_slot` says where that holds); the layer then calls its attention as before.

`install(model)` gives the attention blocks it can serve a subclass of their own class whose
`__call__` takes this path for a one-token query on a lone sequence's cache (`RowKVCache`:
the fast path) that has a write slot, and mlx-lm's own code for everything else (prefill
chunks, verifies, quantized KV, a block whose projections carry LoRA adapters). A running
batch's decode step (`RaggedBatchKVCache`) keeps mlx-lm's path unless `BATCHES`: on an H200
the kernel ran longer on the device than the three kernels it replaces there, and the
32-client load ran no faster with it (decisions/0058). The blocks it serves: mlx-lm's llama
(Mistral) and qwen2 attention, fused at load, whose RoPE rotates the whole head with a base
or with per-pair frequencies (MLX's `RoPE`, mlx-lm's `Llama3RoPE`). The rotation is MLX's
own arithmetic (its CUDA RoPE kernel's). Each shape of block is checked once against
mlx-lm's path on small inputs before it serves (a mismatch is logged and leaves mlx-lm's
path); CUDA only. Engine thread only.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from typing import Any, cast

import attrs
import mlx.core as mx
from mlx.nn.layers.positional_encoding import RoPE

from ..models import FusedPart, fused_sizes
from ._backend import on_cuda
from ._own_kernels import CudaKernel
from ._row_cache import RowKVCache
from ._scalars import scalar
from ._upstream import Llama3RoPE

log = logging.getLogger("mlx_nursery.engine")

PRELUDE = """
    // One thread a pair of elements (i and i + D/2, or 2i and 2i + 1 where TRADITIONAL) of
    // one head of one row's fused product (B, 1, (HQ + 2 HKV) D, contiguous: a matmul's
    // output): a query head's pair rotated into `q_out` (B, HQ, 1, D), a key head's rotated
    // and a value head's copied into the buffers `keys` and `values` (B, HKV, capacity, D,
    // through their strides) at position `index`. The buffers are declared as inputs and
    // written in place (`_kv_append`'s docstring says why that is safe). The rotation is
    // MLX's RoPE kernel's: the angle position * inverse frequency, the inverse frequency
    // from `freqs` (per pair where FREQS, else 2^(-i/(D/2) log2 base)). `previous`, the
    // cache's previous write, is not read: an input that orders this write after it.
    constexpr int HALF = D / 2;
    constexpr int HEADS = HQ + 2 * HKV;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const long long b = blockIdx.y;
    if (t >= HEADS * HALF) {
        return;
    }
    const int head = t / HALF;
    const int i = t % HALF;
    const int i1 = TRADITIONAL ? 2 * i : i;
    const int i2 = TRADITIONAL ? 2 * i + 1 : i + HALF;
    const T* source = qkv + (b * HEADS + head) * D;
    const long long position = index[0];
    if (head >= HQ + HKV) {
        T* target = const_cast<T*>(values) + b * values_strides[0]
            + (head - HQ - HKV) * values_strides[1] + position * values_strides[2];
        target[i1 * values_strides[3]] = source[i1];
        target[i2 * values_strides[3]] = source[i2];
        return;
    }
    float inv_freq;
    if (FREQS) {
        inv_freq = 1.0 / freqs[i];
    } else {
        const float d = static_cast<float>(i) / static_cast<float>(HALF);
        inv_freq = exp2(-d * freqs[0]);
    }
    const float theta = (scale[0] * static_cast<float>(positions[b])) * inv_freq;
    const float cos_theta = cos(theta);
    const float sin_theta = sin(theta);
    const float x1 = static_cast<float>(source[i1]);
    const float x2 = static_cast<float>(source[i2]);
    const T r1 = static_cast<T>(x1 * cos_theta - x2 * sin_theta);
    const T r2 = static_cast<T>(x1 * sin_theta + x2 * cos_theta);
    if (head < HQ) {
        T* target = q_out + (b * HQ + head) * D;
        target[i1] = r1;
        target[i2] = r2;
    } else {
        T* target = const_cast<T*>(keys) + b * keys_strides[0]
            + (head - HQ) * keys_strides[1] + position * keys_strides[2];
        target[i1 * keys_strides[3]] = r1;
        target[i2 * keys_strides[3]] = r2;
    }
"""

_THREADS = 256

_SERVED = frozenset({"mlx_lm.models.llama", "mlx_lm.models.qwen2"})
"""mlx-lm modules whose `Attention` projects, rotates, caches and attends as `_call` expects
(Mistral is mlx-lm's llama)."""

ENABLED = True
"""Whether `install` gives blocks the one-kernel path: bench/batch_step.py and
bench/step_anatomy.py turn it off to measure against mlx-lm's path in one run."""

BATCHES = False
"""Whether a running batch's decode step takes the path too (module docstring): for
bench/batch_step.py and bench/step_anatomy.py to measure again."""

_kernel = CudaKernel(
    name="nursery_decode_prelude",
    input_names=["qkv", "keys", "values", "positions", "index", "freqs", "scale", "previous"],
    output_names=["q_out"],
    source=PRELUDE,
    ensure_row_contiguous=False,  # MLX's compile, where it compiles: never copy the buffers
)
"""Compiled here (`_own_kernels`), where MLX copies an input that is not row-contiguous
before the call: a write into such a copy would be lost. The buffers it writes are a cache's
own (`write_slot`), which only MLX's zeros, concatenations and slice updates made: always
row-contiguous. MLX's own compile, where it serves, passes the buffers as they are, with
their strides."""


@attrs.frozen(cache_hash=True)  # a key of `checked`, looked up by every layer of a step
class Plan:
    """A block's heads and rotation, as the kernel takes them; one object for every block
    of the same (`install` shares them)."""

    q_heads: int
    kv_heads: int
    dim: int
    traditional: bool
    freqs: mx.array = attrs.field(eq=False)
    """float32: the per-pair frequencies (`with_freqs`), or log2 of the base alone."""
    with_freqs: bool
    scale: float
    """RoPE's position scale."""
    frequencies: tuple[float, ...]
    """`freqs` on the host: what makes two blocks' rotations the same."""
    scale_array: mx.array = attrs.field(eq=False)

    def template(self, dtype: mx.Dtype) -> list[tuple[str, int | bool | mx.Dtype]]:
        return [
            ("HQ", self.q_heads), ("HKV", self.kv_heads), ("D", self.dim),
            ("TRADITIONAL", self.traditional), ("FREQS", self.with_freqs), ("T", dtype),
        ]  # fmt: skip


def plan_for(block: Any) -> Plan | None:
    """What the kernel needs to serve `block`, or None where it cannot (module docstring)."""
    if type(block).__module__ not in _SERVED or type(block).__name__ != "Attention":
        return None
    sizes = fused_sizes([getattr(block, name, None) for name in ("q_proj", "k_proj", "v_proj")])
    if sizes is None or "qkv_proj" not in block:
        return None
    q_size, k_size, v_size = sizes
    heads, kv_heads = int(block.n_heads), int(block.n_kv_heads)
    dim = q_size // heads
    if dim % 2 or q_size != heads * dim or not k_size == v_size == kv_heads * dim:
        return None
    if heads % kv_heads:
        return None
    rope = block.rope
    if type(rope) is RoPE and rope.dims == dim:
        freqs, with_freqs, scale = mx.array([math.log2(rope.base)], mx.float32), False, rope.scale
    elif type(rope) is Llama3RoPE and rope.dims == dim:
        freqs, with_freqs, scale = rope._freqs.astype(mx.float32), True, 1.0
    else:
        return None
    frequencies = tuple(cast(list[float], freqs.tolist()))
    return Plan(heads, kv_heads, dim, bool(rope.traditional), freqs, with_freqs, float(scale),
                frequencies, mx.array([scale], mx.float32))  # fmt: skip


_checked: dict[tuple[Plan, mx.Dtype], bool] = {}
_references: dict[Plan, Any] = {}
"""Per plan: the first block's RoPE module, which `checked` compares the kernel with."""


def checked(plan: Plan, dtype: mx.Dtype) -> bool:
    """Whether the kernel gives what mlx-lm's path gives for `plan`'s blocks in `dtype`:
    checked once on small inputs (a failure or a mismatch is logged, and those blocks keep
    mlx-lm's path). Blocks for the check, once per plan and dtype."""
    key = (plan, dtype)
    found = _checked.get(key)
    if found is None:
        found = _checked[key] = _self_check(plan, dtype)
    return found


class _Buffers:
    """What `prelude` reads of a cache."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array) -> None:
        self.keys, self.values, self.offset = keys, values, offset


def _self_check(plan: Plan, dtype: mx.Dtype) -> bool:
    rope = _references[plan]
    rows, capacity, index = 3, 64, 37
    heads, kv_heads, dim = plan.q_heads, plan.kv_heads, plan.dim
    try:
        qkv, keys, values = (
            mx.random.normal(shape, key=mx.random.key(seed)).astype(dtype)
            for seed, shape in enumerate([
                (rows, 1, (heads + 2 * kv_heads) * dim),
                (rows, kv_heads, capacity, dim),
                (rows, kv_heads, capacity, dim),
            ])
        )  # fmt: skip
        positions = mx.array([0, 5, 3001], dtype=mx.int32)
        want_keys, want_values = keys + 0, values + 0  # copies, made before the write
        mx.eval(qkv, keys, values, want_keys, want_values)
        q, k, v = (
            part.reshape(rows, 1, -1, dim).transpose(0, 2, 1, 3)
            for part in mx.split(qkv, [heads * dim, (heads + kv_heads) * dim], axis=-1)
        )
        want_queries = rope(q, offset=positions)
        want_keys[:, :, index : index + 1] = rope(k, offset=positions)
        want_values[:, :, index : index + 1] = v
        got = prelude(qkv, _Buffers(keys, values, positions), index, plan)
        mx.eval(got)  # run before the comparisons are encoded: under CUDA graphs too
        keys, values = mx.depends([keys, values], [got])
        tolerance = 1e-4 if dtype == mx.float32 else 1e-2
        same = (
            mx.allclose(got, want_queries, rtol=tolerance, atol=tolerance).item()
            and mx.allclose(keys, want_keys, rtol=tolerance, atol=tolerance).item()
            and mx.array_equal(values, want_values).item()
        )
    except Exception:
        log.warning("decode prelude unusable for %s in %s; mlx-lm's path serves",
                    plan, dtype, exc_info=True)  # fmt: skip
        return False
    if not same:
        log.warning("decode prelude differs from mlx-lm's path for %s in %s; mlx-lm's path"
                    " serves", plan, dtype)  # fmt: skip
    return bool(same)


def previous_write(cache: Any) -> mx.array:
    """Under CUDA graphs, the marker of `cache`'s previous write in place (`pending_write`),
    an input the kernel does not read, so that this write follows that one even where
    nothing else links two steps in one evaluation (known tokens fed one at a time; an
    update of MLX's in between commits the earlier write first, `_kv_append.settle`).
    A constant where the cache keeps none: after an update of MLX's, and with graphs known
    off, where kernels run in launch order (`_kv_append.kept`)."""
    marker: mx.array | None = getattr(cache, "pending_write", None)
    return scalar(0, mx.int32) if marker is None else marker


def prelude(qkv: mx.array, cache: Any, index: int, plan: Plan) -> mx.array:
    """The rotated queries (B, HQ, 1, D) of `qkv` (B, 1, (HQ + 2 HKV) D), its keys and
    values written into `cache`'s buffers at `index` (its write slot, taken by the caller,
    who tells the cache it was written). Lazy, as any MLX operation."""
    batch = qkv.shape[0]
    keys, values = cache.keys, cache.values
    if index + 1 > keys.shape[2] or keys.shape[2] != values.shape[2]:
        raise ValueError("the new keys do not fit the buffers at the write index")
    positions = cache.offset
    if not isinstance(positions, mx.array):
        positions = scalar(int(positions), mx.int32)
    (q_out,) = _kernel(
        inputs=[qkv, keys, values, positions, scalar(index, mx.int64),
                plan.freqs, plan.scale_array, previous_write(cache)],
        template=plan.template(qkv.dtype),
        grid=((plan.q_heads + 2 * plan.kv_heads) * plan.dim // 2, batch, 1),
        threadgroup=(_THREADS, 1, 1),
        output_shapes=[(batch, plan.q_heads, 1, plan.dim)],
        output_dtypes=[qkv.dtype],
    )  # fmt: skip
    result: mx.array = q_out
    return result


def _call(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    """mlx-lm's attention block's forward, with a one-token query's heads made ready by
    `prelude` where the cache has a write slot (module docstring)."""
    plan: Plan = self._nursery_plan
    write_slot = getattr(cache, "write_slot", None)
    if (
        x.shape[1] == 1
        and write_slot is not None
        and (x.shape[0] == 1 if type(cache) is RowKVCache else BATCHES)
        and type(self.q_proj) is FusedPart  # no adapters wrapped around the parts
        and type(self.k_proj) is FusedPart
        and type(self.v_proj) is FusedPart
    ):
        index = write_slot(x.dtype, 1, ordered=True)  # its output is the queries
        if index is not None and checked(plan, x.dtype):  # not checked where never served
            qkv = self.q_proj.group(x)  # the parts' own product (an adapter wraps a part)
            if qkv.dtype == x.dtype:
                queries = prelude(qkv, cache, index, plan)
                cache.written(queries, 1)
                keys, values = cache.keys_and_values()
                attention = self._nursery_attention()
                output = attention(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
                return self.o_proj(output.transpose(0, 2, 1, 3).reshape(x.shape[0], 1, -1))  # type: ignore[no-any-return]
    return self._nursery_base_call(x, mask=mask, cache=cache)  # type: ignore[no-any-return]


_classes: dict[type, type] = {}


def _served_class(base: type) -> type:
    served = _classes.get(base)
    if served is None:
        module = sys.modules[base.__module__]

        def attention() -> Callable[..., mx.array]:
            found: Callable[..., mx.array] = module.scaled_dot_product_attention
            return found  # looked up at each call: `_decode_attention.install` routes it

        served = _classes[base] = type(
            base.__name__,
            (base,),
            {
                "__call__": _call,
                "__module__": base.__module__,
                "_nursery_base_call": base.__call__,
                "_nursery_attention": staticmethod(attention),
            },
        )
    return served


def install(model: Any) -> int:
    """Give `model`'s attention blocks that `plan_for` serves the one-kernel path (where
    `ENABLED`, on CUDA); returns how many. Idempotent."""
    if not ENABLED or not on_cuda():
        return 0
    served = 0
    plans: dict[Plan, Plan] = {}
    for _, block in model.named_modules():
        if getattr(block, "_nursery_plan", None) is not None:
            served += 1
            continue
        plan = plan_for(block)
        if plan is None:
            continue
        plan = plans.setdefault(plan, plan)
        _references.setdefault(plan, block.rope)
        block._nursery_plan = plan
        block.__class__ = _served_class(type(block))
        served += 1
    return served
