"""What the engine's own CUDA kernels cost a start: MLX compiles each custom kernel (NVRTC)
at its first use in every process, and never keeps it in its disk cache as it keeps its
own kernels, so an engine's warm-up builds them again at each start.

In a fresh process, each of the engine's custom kernels in the variants a bfloat16 8B-class
model runs (Llama-3.1-8B's heads: 32 query heads over 8 key-value heads of 128) is run
once (its build and first run) and again (the run alone): the ragged decode attention in
its one-kernel form and its split form (slices, then their combination), the in-place KV
write, and the sequence attention's masked softmax (causal and masked, with and without
16-byte loads, as its self-check builds them). The difference is what the start pays for
that kernel; the sum, what a cache of compiled kernels of the engine's own would save.

Usage (the GPU machine, a fresh process each time):
  python -P bench/custom_kernels.py --out custom-kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing
from kv_append import merged

from mlx_nursery.engine import _kv_append, _own_kernels
from mlx_nursery.engine._backend import on_cuda
from mlx_nursery.engine._decode_attention import ragged_decode_attention
from mlx_nursery.engine._masked_softmax import usable

SCALE = 128**-0.5


def timed(run: Callable[[], object]) -> float:
    """Seconds `run`'s arrays take to evaluate, the device synchronized after."""
    start = time.perf_counter()
    mx.eval(run())
    mx.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not on_cuda():
        sys.exit("the engine's kernels are CUDA's: run this on the GPU machine")
    mx.synchronize()
    queries = mx.random.normal((32, 32, 1, 128)).astype(mx.bfloat16)
    one = mx.random.normal((1, 32, 1, 128)).astype(mx.bfloat16)
    whole, split = merged([300] * 32, seed=0), merged([600], seed=1)  # one kernel; split
    mx.eval(whole.keys, whole.values, split.keys, split.values)
    new = mx.random.normal((2, 32, 8, 1, 128)).astype(mx.bfloat16)
    mx.eval(queries, one, new)
    assert whole.keys is not None and whole.values is not None
    buffers = whole.keys, whole.values
    kernels: dict[str, Callable[[], object]] = {
        "decode attention, one kernel": lambda: ragged_decode_attention(queries, whole, SCALE),
        "decode attention, split": lambda: ragged_decode_attention(one, split, SCALE),
        "KV write in place": lambda: _kv_append.append_in_place(
            *buffers, new[0], new[1], whole._idx
        ),
    }
    measured: dict[str, dict[str, object]] = {}
    for name, run in kernels.items():
        first, again = timed(run), timed(run)
        measured[name] = {"first_s": round(first, 3), "again_s": round(again, 4)}
        print(f"{name:32s} first {first:7.3f} s   again {again:7.4f} s")
    start = time.perf_counter()
    ok = usable(mx.bfloat16)  # builds and checks every masked-softmax variant
    seconds = time.perf_counter() - start
    measured["masked softmax, its self-check (4 variants)"] = {
        "first_s": round(seconds, 3),
        "usable": ok,
    }
    print(f"{'masked softmax (4 variants)':32s} first {seconds:7.3f} s   usable {ok}")
    here = _own_kernels.compiler() is not None
    print(f"compiled by the engine's NVRTC (not MLX): {here}")
    summary = {"device": str(mx.default_device()), "compiled_here": here, "kernels": measured}
    text = json.dumps(summary, indent=1)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
