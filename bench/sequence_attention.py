"""A sequence's attention for a query of several tokens: the engine's layout against MLX's.

For one sequence's mlx-lm `KVCache` holding a prior context and then a query of L new tokens
(a prefill chunk, the tail of a prompt after a prefix-cache hit, a speculative verify), and
for a batch's cache (prompts prefilled together, a batch's verify) with mlx-lm's mask,
compares `_sequence_attention.sequence_attention` with what mlx-lm runs,
`mx.fast.scaled_dot_product_attention`: equal outputs, then the time of
one forward's worth of layers (each layer a cache of its own) for each shape. On CUDA with
cuDNN attention off (`MLX_CUDA_USE_CUDNN_SDPA=0`, the server's default) MLX's side is its
composed fallback; `--cudnn` times MLX's side with cuDNN on instead (set before MLX's first
attention: a process of its own). Runs anywhere; the comparison it exists for is CUDA's.

Usage: python -P bench/sequence_attention.py [--cudnn] [--kernels] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

SHAPES = [  # (each row's prior tokens, query tokens): what the engine meets
    ((8010,), 43),  # a prompt's own tail after a warm ~8,000-token shared prompt
    ((600,), 5),  # a verify of 4 drafts
    ((600,), 9),  # a verify of 8 drafts
    ((1700,), 9),
    ((0,), 512),  # a prompt's first prefill chunk
    ((4096,), 512),  # a long prompt's later chunk
    ((700,), 300),  # a chunk after a prefix-cache hit of odd length
    ((0, 0, 0, 0), 256),  # four prompts' first chunk together (a prompt batch)
    ((300, 517, 211, 680), 256),  # and a later one, rows of different lengths
    ((590, 610, 633, 570, 701, 655, 600, 620), 5),  # a batch's verify, 8 rows of 4 drafts
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cudnn", action="store_true", help="MLX's side with cuDNN attention on")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument(
        "--heads", default="32,8,128", help="query heads, key-value heads, head size (8B's)"
    )
    p.add_argument("--kernels", action="store_true", help="the device's own time (CUDA)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "1" if args.cudnn else "0"
    import mlx.core as mx

    from mlx_nursery.engine._ragged import RaggedBatchKVCache, RowKVCache
    from mlx_nursery.engine._sequence_attention import sequence_attention, takes
    from mlx_nursery.engine._upstream import KVCache

    Layer = tuple[Any, mx.array, mx.array, Any]

    sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing
    from _kernels import profile_steps

    heads, kv_heads, dim = (int(x) for x in args.heads.split(","))
    dtype = mx.bfloat16
    scale = dim**-0.5
    rng = random.Random(0)

    def normal(*shape: int) -> mx.array:
        return mx.random.normal(shape, key=mx.random.key(rng.randrange(1 << 30))).astype(dtype)

    def cache_with(priors: tuple[int, ...], length: int) -> Layer:
        """One layer's cache after this forward's update, and the mask mlx-lm passes."""
        if len(priors) == 1:
            cache = KVCache()
            if priors[0]:
                cache.update_and_fetch(*(normal(1, kv_heads, priors[0], dim) for _ in "kv"))
            mask: Any = "causal"
        else:  # a batch, as the engine merges its rows
            rows = []
            for prior in priors:
                row = RowKVCache()
                if prior:
                    row.update_and_fetch(*(normal(1, kv_heads, prior, dim) for _ in "kv"))
                rows.append(row)
            cache = RaggedBatchKVCache.merge(rows)
            mask = cache.make_mask(length)  # before the update, as mlx-lm makes it
        keys, values = cache.update_and_fetch(
            *(normal(len(priors), kv_heads, length, dim) for _ in "kv")
        )
        return cache, keys, values, mask

    def mlx_side(q: mx.array, cache: Any, keys: mx.array, values: mx.array, mask: Any) -> mx.array:
        return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)

    def ours(q: mx.array, cache: Any, keys: mx.array, values: mx.array, mask: Any) -> mx.array:
        assert takes(q, keys, values, cache, mask, None)
        return sequence_attention(q, cache, scale, mask)

    variants: dict[str, Callable[..., mx.array]] = {
        "mlx_cudnn" if args.cudnn else "mlx_composed": mlx_side,
        "ours": ours,
    }
    rows = []
    for priors, length in SHAPES:
        layers = [cache_with(priors, length) for _ in range(args.layers)]
        q = normal(len(priors), heads, length, dim)
        mx.eval(q, [(c.keys, c.values, k, v) for c, k, v, _ in layers])
        want = mlx_side(q, *layers[0]).astype(mx.float32)
        got = ours(q, *layers[0]).astype(mx.float32)
        row: dict[str, Any] = {
            "priors": list(priors),
            "query": length,
            "max_abs_error": cast(float, mx.max(mx.abs(want - got)).item()),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():  # first calls build kernels
            mx.eval([fn(q, *layer) for layer in layers])
        for r in range(args.rounds):
            order = list(variants.items())
            for name, fn in order if r % 2 == 0 else order[::-1]:
                mx.synchronize()
                tic = time.perf_counter()
                mx.eval([fn(q, *layer) for layer in layers])
                mx.synchronize()
                times[name].append(time.perf_counter() - tic)
        for name, samples in times.items():
            samples.sort()
            row[f"{name}_ms"] = round(1000 * samples[len(samples) // 2], 3)
            if args.kernels:

                def step(
                    fn: Callable[..., mx.array] = variants[name],
                    q: mx.array = q,
                    layers: list[Layer] = layers,
                ) -> None:
                    mx.eval([fn(q, *layer) for layer in layers])

                profile = profile_steps(step, 4)
                row[f"{name}_device_ms"] = profile.get("busy_ms_per_step")
                row[f"{name}_kernels"] = profile.get("kernels_per_step")
        names = list(variants)
        row["ours_x"] = round(row[f"{names[0]}_ms"] / row["ours_ms"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "device": str(mx.default_device()),
        "heads": [heads, kv_heads, dim],
        "layers": args.layers,
        "cudnn": args.cudnn,
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
