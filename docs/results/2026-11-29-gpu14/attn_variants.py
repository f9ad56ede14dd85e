"""Where a long prefill chunk's attention goes on CUDA, and layouts that might cut it: the
device's time by kernel family for `_sequence_attention` and variants of it (an additive
mask, MLX's fast softmax, the query in blocks whose keys stop at the block's last position),
beside MLX's composed fallback, one forward's 32 layers each a cache of its own. A probe for
issue 32 (decisions/0054 left long chunks at ~0.67 ms a layer against cuDNN's 0.1), not a
benchmark.

Usage: MLX_CUDA_USE_CUDNN_SDPA=0 python3 -P attn_variants.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.append(str(Path.cwd() / "bench"))
from _kernels import profile_steps  # noqa: E402

from mlx_nursery.engine._sequence_attention import sequence_attention  # noqa: E402
from mlx_nursery.engine._upstream import KVCache  # noqa: E402

HEADS, KV, DIM, LAYERS = [int(x) for x in __import__("os").environ.get("SHAPE", "32,8,128,32").split(",")]
DT = mx.bfloat16
SCALE = DIM**-0.5


def folded(q: mx.array, keys: mx.array, values: mx.array, visible: mx.array, *, additive: bool,
           precise: bool) -> mx.array:
    b, h, n, d = q.shape
    rep = h // KV
    p = keys.shape[2]
    s = (q * mx.array(SCALE, DT)).reshape(b, KV, rep * n, d) @ keys.swapaxes(-1, -2)
    s = s.reshape(b, KV, rep, n, p)
    if additive:
        s = s + visible
    else:
        s = mx.where(visible, s, mx.array(mx.finfo(DT).min, DT))
    w = mx.softmax(s, axis=-1, precise=precise).reshape(b, KV, rep * n, p)
    return (w @ values).reshape(b, h, n, d)


def masks(length: int, total: int, padded: int) -> tuple[mx.array, mx.array]:
    pos = mx.arange(total - length, total)[:, None]
    vis = mx.arange(padded)[None, :] <= pos
    bias = mx.where(vis, mx.array(0, DT), mx.array(-float("inf"), DT))
    return vis, bias


def run(prior: int, length: int) -> dict[str, Any]:
    layers = []
    for i in range(LAYERS):
        c = KVCache()
        if prior:
            c.update_and_fetch(*(mx.random.normal((1, KV, prior, DIM)).astype(DT) for _ in "kv"))
        k, v = c.update_and_fetch(*(mx.random.normal((1, KV, length, DIM)).astype(DT) for _ in "kv"))
        layers.append((c, k, v))
    q = mx.random.normal((1, HEADS, length, DIM)).astype(DT)
    mx.eval(q, [(c.keys, c.values) for c, _, _ in layers])
    total = prior + length
    padded = min(-(-total // 16) * 16, layers[0][0].keys.shape[2])
    vis, bias = masks(length, total, padded)

    def buf(c: Any) -> tuple[mx.array, mx.array]:
        return c.keys[..., :padded, :], c.values[..., :padded, :]

    def blocks(q: mx.array, c: Any, size: int) -> mx.array:
        outs = []
        for start in range(0, length, size):
            end = min(length, start + size)
            last = total - length + end  # keys the block's last query sees
            pb = min(-(-last // 16) * 16, c.keys.shape[2])
            pos = mx.arange(total - length + start, total - length + end)[:, None]
            vis_b = mx.arange(pb)[None, :] <= pos
            outs.append(folded(q[:, :, start:end], c.keys[..., :pb, :], c.values[..., :pb, :],
                               vis_b, additive=False, precise=True))
        return mx.concatenate(outs, axis=2)

    variants = {
        "mlx_composed": lambda c, k, v: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=SCALE, mask="causal"),
        "ours": lambda c, k, v: sequence_attention(q, c, SCALE),
        "ours_additive": lambda c, k, v: folded(q, *buf(c), bias, additive=True, precise=True),
        "ours_fast_softmax": lambda c, k, v: folded(q, *buf(c), vis, additive=False, precise=False),
        "ours_blocks_128": lambda c, k, v: blocks(q, c, 128),
        "ours_blocks_64": lambda c, k, v: blocks(q, c, 64),
    }
    want = variants["mlx_composed"](*layers[0]).astype(mx.float32)
    out: dict[str, Any] = {"prior": prior, "query": length}
    for name, fn in variants.items():
        err = mx.max(mx.abs(fn(*layers[0]).astype(mx.float32) - want)).item()
        mx.eval([fn(*l) for l in layers])
        ts = []
        for _ in range(7):
            mx.synchronize()
            t = time.perf_counter()
            mx.eval([fn(*l) for l in layers])
            mx.synchronize()
            ts.append(time.perf_counter() - t)
        ts.sort()
        prof = profile_steps(lambda fn=fn: mx.eval([fn(*l) for l in layers]), 2)
        out[name] = {
            "wall_ms": round(1000 * ts[3], 2),
            "device_ms": prof.get("busy_ms_per_step"),
            "kernels": prof.get("kernels_per_step"),
            "max_err": err,
            "families": [(f["family"], f["per_step"], f["us_per_step"]) for f in prof.get("by_family", [])[:6]],
        }
        print(json.dumps({"shape": [prior, length], name: out[name]}), flush=True)
    return out


if __name__ == "__main__":
    results = [run(p, n) for p, n in [(4096, 512), (16384, 512), (0, 512), (8010, 43)]]
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(results, indent=1))
