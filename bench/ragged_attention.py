"""The ragged decode-attention kernel against MLX's masked attention: equal outputs, and time.

For rows of different lengths in one left-padded batch cache (`RaggedBatchKVCache`, built
the way `BatchGenerator` builds it: rows merged, then one decode token written), compares
`_decode_attention.ragged_decode_attention` with `mx.fast.scaled_dot_product_attention` under
the cache's mask (what mlx-lm runs), over head layouts, head sizes and dtypes; then times
both for a batch shaped like a busy server's (32 rows of 500-1,200 tokens, Llama-3.1-8B's
heads), as one step's 32 layers. CUDA only (the kernel's backend); elsewhere it says so.

`--previous FILE` checks and times another version of `engine/_decode_attention.py` beside
the current one, in the same run (a kernel change against the kernel it replaces; a version
before decisions/0060 ran the engine's own compile, this one MLX's);
`--target-blocks N ...` times the current kernel at other grid sizes too.

Usage: python -P bench/ragged_attention.py [--previous FILE] [--target-blocks N ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import mlx.core as mx

from mlx_nursery.engine import _decode_attention, _own_kernels
from mlx_nursery.engine._decode_attention import available
from mlx_nursery.engine._ragged import RaggedBatchKVCache, RowKVCache

sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing
from _kernels import decode_block_fits, profile_steps

Kernel = Callable[[mx.array, RaggedBatchKVCache, float], mx.array]


def load_previous(path: Path) -> Kernel:
    """`ragged_decode_attention` of another version of the module (its relative imports
    resolve in the engine package)."""
    spec = importlib.util.spec_from_file_location("mlx_nursery.engine._previous_attention", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel: Kernel = module.ragged_decode_attention
    return kernel


def batch_cache(
    lengths: list[int], kv_heads: int, dim: int, dtype: mx.Dtype, rng: random.Random
) -> RaggedBatchKVCache:
    rows = []
    for n in lengths:
        row = RowKVCache()
        k = mx.random.normal((1, kv_heads, n, dim), key=mx.random.key(rng.randrange(1 << 30)))
        v = mx.random.normal((1, kv_heads, n, dim), key=mx.random.key(rng.randrange(1 << 30)))
        row.update_and_fetch(k.astype(dtype), v.astype(dtype))
        rows.append(row)
    cache = RaggedBatchKVCache.merge(rows)
    cache.step_mask = cache.make_mask(1)  # as mlx-lm makes it: before the step's update
    step_k = mx.random.normal((len(lengths), kv_heads, 1, dim)).astype(dtype)
    step_v = mx.random.normal((len(lengths), kv_heads, 1, dim)).astype(dtype)
    cache.update_and_fetch(step_k, step_v)
    return cache


def reference(queries: mx.array, cache: RaggedBatchKVCache, scale: float) -> mx.array:
    keys, values = cache.keys_and_values()
    return mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=scale, mask=cache.step_mask
    )


def check(rng: random.Random, kernel: Kernel) -> list[dict[str, Any]]:
    cases = []
    for batch, heads, kv_heads, dim, dtype in [
        (1, 32, 8, 128, mx.bfloat16),
        (3, 32, 8, 128, mx.bfloat16),
        (32, 32, 8, 128, mx.bfloat16),
        (5, 28, 4, 128, mx.float16),
        (4, 8, 8, 64, mx.float32),
        (6, 16, 2, 64, mx.bfloat16),
        (2, 12, 4, 96, mx.float16),
    ]:
        lengths = [rng.randint(1, 1500) for _ in range(batch)]
        cache = batch_cache(lengths, kv_heads, dim, dtype, rng)
        queries = mx.random.normal((batch, heads, 1, dim)).astype(dtype)
        scale = dim**-0.5
        want = reference(queries, cache, scale).astype(mx.float32)
        got = kernel(queries, cache, scale).astype(mx.float32)
        error = cast(float, mx.max(mx.abs(want - got)).item())  # a float32 scalar's item
        cases.append(
            {
                "batch": batch,
                "heads": heads,
                "kv_heads": kv_heads,
                "dim": dim,
                "dtype": str(dtype),
                "max_abs_error": error,
                "ok": error < (2e-2 if dtype != mx.float32 else 1e-4),
            }
        )
    return cases


def timing(
    rng: random.Random,
    kernels: dict[str, Kernel],
    layers: int = 32,
    rounds: int = 20,
    *,
    rows: int = 32,
    lengths_from: tuple[int, int] = (500, 1200),
    device_time: bool = False,
) -> dict[str, Any]:
    lengths = [rng.randint(*lengths_from) for _ in range(rows)]
    caches = [batch_cache(lengths, 8, 128, mx.bfloat16, rng) for _ in range(4)]
    queries = mx.random.normal((rows, 32, 1, 128)).astype(mx.bfloat16)
    mx.eval([c.state for c in caches], queries)
    scale = 128**-0.5
    out: dict[str, Any] = {
        "rows": rows,
        "lengths": [min(lengths), max(lengths)],
        "layers": layers,
    }
    kv_bytes = sum(lengths) * 8 * 128 * 2 * 2  # one layer's keys and values, bfloat16
    for name, fn in {"masked_sdpa": reference, **kernels}.items():
        mx.eval([fn(queries, c, scale) for c in caches])  # build kernels
        times = []
        for _ in range(rounds):
            mx.synchronize()
            tic = time.perf_counter()
            mx.eval([fn(queries, caches[i % 4], scale) for i in range(layers)])
            mx.synchronize()
            times.append(time.perf_counter() - tic)
        times.sort()
        out[f"{name}_ms_per_step"] = round(1000 * times[len(times) // 2], 3)
        if device_time:  # the kernels' own time (CUPTI), apart from launching them

            def step(fn: Kernel = fn) -> None:
                mx.eval([fn(queries, caches[i % 4], scale) for i in range(layers)])

            profile = profile_steps(step, 8)
            busy = profile.get("busy_ms_per_step")
            out[f"{name}_device_ms_per_step"] = busy
            out[f"{name}_kernels"] = profile.get("by_family")
            if busy:
                out[f"{name}_kv_read_tb_per_s"] = round(kv_bytes * layers / busy / 1e9, 2)
    for name in kernels:
        out[f"{name}_x_masked"] = round(
            out["masked_sdpa_ms_per_step"] / out[f"{name}_ms_per_step"], 2
        )
    return out


def patched(*changes: tuple[ModuleType, str, object]) -> Kernel:
    """The current kernel with each (module, name, value) set for the call and put back
    after: the engine's choices as module constants, tried one variant at a time."""

    def kernel(queries: mx.array, cache: RaggedBatchKVCache, scale: float) -> mx.array:
        saved = [(module, name, getattr(module, name)) for module, name, _ in changes]
        for module, name, value in changes:
            setattr(module, name, value)
        try:
            out: mx.array = _decode_attention.ragged_decode_attention(queries, cache, scale)
            return out
        finally:
            for module, name, value in saved:
                setattr(module, name, value)

    return kernel


def at_blocks(blocks: int) -> Kernel:
    """The current kernel with `blocks` as its grid's target."""
    return patched((_decode_attention, "_TARGET_BLOCKS", blocks))


def at_threads(threads: int) -> Kernel:
    """The current kernel with `threads` a block (`threads / 32` warps taking tiles of a
    slice's keys in turn, combined in shared memory at the end) in place of the engine's."""
    return patched(
        (_decode_attention, "_THREADS", threads), (_decode_attention, "_WARPS", threads // 32)
    )


def with_vector_values() -> Kernel:
    """The current kernel with a lane reading a key's values in one load
    (`_decode_attention._VECTOR_VALUES`)."""
    return patched((_decode_attention, "_VECTOR_VALUES", True))


def compiled_here() -> Kernel:
    """The current kernel compiled by the engine's own NVRTC call (`_own_kernels`,
    decisions/0057) rather than by MLX (`mx.fast.cuda_kernel`, the engine's choice since
    decisions/0060): the same source, the two compiles' device time side by side. Its kernels
    are its own (the engine's cache holds MLX's compiles)."""
    return patched(
        (_decode_attention, "_kernels", {}), (_decode_attention, "COMPILED_BY_MLX", False)
    )


def compiled_for(arch: str) -> Kernel:
    """The current kernel compiled by the engine's NVRTC call for `arch` (e.g. sm_90a, as
    MLX targets a Hopper) rather than for the device's plain compute capability."""
    base = _own_kernels.compiler()
    if base is None:
        raise SystemExit(f"--arch {arch}: no NVRTC here for the engine's own compile")
    alternative = copy.copy(base)
    alternative._options = [f"--gpu-architecture={arch}".encode(), *base._options[1:]]
    return patched(
        (_decode_attention, "_kernels", {}),
        (_decode_attention, "COMPILED_BY_MLX", False),
        (_own_kernels, "compiler", lambda: alternative),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--previous", type=Path, help="another version of _decode_attention.py")
    p.add_argument("--target-blocks", type=int, nargs="*", default=[])
    p.add_argument(
        "--own-compiled",
        action="store_true",
        help="also the same kernel compiled by the engine's NVRTC call, not by MLX",
    )
    p.add_argument("--arch", nargs="*", default=[], help="also compiled for these targets")
    p.add_argument("--threads", type=int, nargs="*", default=[], help="also these block sizes")
    p.add_argument("--vector-values", action="store_true", help="also a lane's values in one load")
    p.add_argument(
        "--again",
        action="store_true",
        help="time the kernel in service once more after every variant (the run's drift)",
    )
    p.add_argument(
        "--kernels",
        action="store_true",
        help="also the device's own time for each variant (torch.profiler), and the KV "
        "read rate it means",
    )
    p.add_argument(
        "--rows", type=int, nargs="*", default=[32], help="batch sizes to time (default 32)"
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not available():
        print(json.dumps({"skipped": f"no CUDA ({mx.default_device()})"}))
        return
    kernels: dict[str, Kernel] = {"ragged_kernel": _decode_attention.ragged_decode_attention}
    if args.previous:
        kernels["previous_kernel"] = load_previous(args.previous)
    for blocks in args.target_blocks:
        kernels[f"ragged_kernel_{blocks}_blocks"] = at_blocks(blocks)
    if args.own_compiled:
        kernels["own_compiled"] = compiled_here()
    for threads in args.threads:
        if not decode_block_fits(threads):
            p.error("--threads: multiples of 32 from 32 to 512 (shared memory past it)")
        kernels[f"ragged_kernel_{threads}_threads"] = at_threads(threads)
    for arch in args.arch:
        kernels[f"compiled_for_{arch}"] = compiled_for(arch)
    if args.vector_values:
        kernels["vector_values"] = with_vector_values()
    if args.again:
        kernels["ragged_kernel_again"] = _decode_attention.ragged_decode_attention
    checks = {name: check(random.Random(0), kernel) for name, kernel in kernels.items()}
    result = {
        "device": str(mx.default_device()),
        "checks": checks,
        "all_ok": all(c["ok"] for cases in checks.values() for c in cases),
        "timing": timing(random.Random(1), kernels, device_time=args.kernels),
        "more_timing": [
            timing(
                random.Random(rows),
                kernels,
                rows=rows,
                lengths_from=lengths,
                device_time=args.kernels,
            )
            for rows in args.rows
            for lengths in ((480, 540), (500, 1200))
            if (rows, lengths) != (32, (500, 1200))
        ],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
