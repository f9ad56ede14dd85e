"""A batch's KV written in place against MLX's slice update: equal contents, and what a
pipelined decode loop pays for the copies (CUDA; `engine/_kv_append.py` says why).

`--check` compares `append_in_place` with MLX's slice update over dtypes, head layouts,
query lengths and a buffer that is a view of a larger one (the rows a filter keeps): the
written positions must hold the new keys bit for bit, and nothing else may change; and a
batch's life (pipelined steps, a filter, a join, a padded chunk, a trim) written in place
must fetch what it fetches with MLX's updates.

The timing runs a decode loop as the engine runs one: `--layers` layers of a
`RaggedBatchKVCache` of `--rows` rows, each step a token's keys and values written into
each layer and the ragged decode attention reading it, the step launched before the
previous one's result is read; once with MLX's update (`copy`: MLX copies a layer's buffer
whenever the step before still reads it) and once in place, alternating over `--rounds`.
Per mode: ms a step and MLX's peak memory (a copied buffer is a second buffer).

Usage (the GPU machine):
  python -P bench/kv_append.py --check --rows 32 --context 500:1000 --out kv-append.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlx_nursery.engine import _kv_append
from mlx_nursery.engine._backend import on_cuda
from mlx_nursery.engine._decode_attention import ragged_decode_attention
from mlx_nursery.engine._ragged import RaggedBatchKVCache, RowKVCache


def check_cases(rng: random.Random) -> list[dict[str, Any]]:
    """`append_in_place` against a slice update, case by case (module docstring)."""
    cases = []
    for rows, heads, dim, dtype, length in [
        (1, 8, 128, mx.bfloat16, 1),
        (32, 8, 128, mx.bfloat16, 1),
        (5, 4, 128, mx.float16, 7),
        (3, 8, 64, mx.float32, 1),
        (6, 2, 96, mx.bfloat16, 33),
    ]:
        for view in (False, True):
            capacity, index = 512, rng.randint(0, 512 - length)
            whole = mx.random.normal((rows + 2 if view else rows, heads, capacity, dim))
            whole = whole.astype(dtype)
            values_whole = (whole * 2).astype(dtype)
            before = whole + 0, values_whole + 0  # copies, made before the write
            mx.eval(whole, values_whole, before)
            keys = whole[1 : rows + 1] if view else whole
            values = values_whole[1 : rows + 1] if view else values_whole
            new_k = mx.random.normal((rows, heads, length, dim)).astype(dtype)
            new_v = mx.random.normal((rows, heads, length, dim)).astype(dtype)
            written = _kv_append.append_in_place(keys, values, new_k, new_v, index)
            keys, values = mx.depends([keys, values], [written])
            mx.eval(keys, values)
            want_k, want_v = before
            lo, hi = (1, rows + 1) if view else (0, rows)
            want_k[lo:hi, :, index : index + length] = new_k
            want_v[lo:hi, :, index : index + length] = new_v
            equal = bool(mx.array_equal(whole, want_k).item()) and bool(
                mx.array_equal(values_whole, want_v).item()
            )
            cases.append(
                {
                    "rows": rows,
                    "heads": heads,
                    "dim": dim,
                    "dtype": str(dtype),
                    "length": length,
                    "view": view,
                    "ok": equal,
                }
            )
    return cases


def merged(lengths: list[int], seed: int) -> RaggedBatchKVCache:
    """A batch of rows of these lengths (random bfloat16 keys, 8 heads of 128), merged."""
    rows = []
    for i, n in enumerate(lengths):
        row = RowKVCache()
        k, v = mx.random.normal((2, 1, 8, n, 128), key=mx.random.key(seed * 100 + i))
        row.update_and_fetch(k.astype(mx.bfloat16), v.astype(mx.bfloat16))
        rows.append(row)
    return RaggedBatchKVCache.merge(rows)


@contextmanager
def kv_writes(in_place: bool) -> Iterator[None]:
    """The batch caches write in place (`in_place`) or as MLX updates, within the block."""
    original = _kv_append.writes_in_place
    setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: in_place)  # noqa: B010
    try:
        yield
    finally:
        setattr(_kv_append, "writes_in_place", original)  # noqa: B010


def batch_life(in_place: bool, *, eager: bool = False) -> list[mx.array]:
    """A batch's life (merge, pipelined decode steps, a filter, a join, a padded chunk, a
    trim and a step after it) with its writes in place or MLX's; what each step fetched.
    `eager`: everything evaluated after each operation (no graph spans two of them)."""
    with kv_writes(in_place):

        def new(rows: int, length: int, seed: int) -> tuple[mx.array, mx.array]:
            k, v = mx.random.normal((2, rows, 8, length, 128), key=mx.random.key(seed))
            return k.astype(mx.bfloat16), v.astype(mx.bfloat16)

        fetched: list[mx.array] = []

        def settle() -> None:
            if eager:
                mx.eval(fetched, cache.keys, cache.values)

        cache = merged([300, 900, 520], seed=1)
        for step in range(8):
            keys, values = cache.update_and_fetch(*new(3, 1, 10 + step))
            mx.async_eval(keys, values)  # type: ignore[no-untyped-call]
            fetched += [mx.sum(keys.astype(mx.float32)), mx.sum(values.astype(mx.float32))]
            settle()
        cache.filter([0, 2])
        settle()
        cache.extend(merged([700], seed=2))
        settle()
        cache.prepare(lengths=[40, 17, 33], right_padding=[0, 23, 7])
        fetched += list(cache.update_and_fetch(*new(3, 40, 30)))
        settle()
        cache.finalize()
        settle()
        cache.trim(2)
        fetched += list(cache.update_and_fetch(*new(3, 1, 40)))
        settle()
        fetched += list(cache.keys_and_values())
        mx.eval(fetched)
        return fetched


def decode_loop(
    mode: str, rows: int, lengths: list[int], layers: int, steps: int
) -> dict[str, float]:
    """ms a step and peak memory of a pipelined decode loop writing in `mode`."""
    with kv_writes(mode == "in-place"):
        caches = [merged(lengths, seed=layer) for layer in range(layers)]
        mx.eval([(c.keys, c.values) for c in caches])
        queries = mx.random.normal((rows, 32, 1, 128)).astype(mx.bfloat16)
        new = mx.random.normal((2, rows, 8, 1, 128)).astype(mx.bfloat16)
        mx.eval(queries, new)
        mx.synchronize()
        mx.reset_peak_memory()
        previous: mx.array | None = None
        times = []
        for step in range(steps):
            start = time.perf_counter()
            outs = []
            for cache in caches:
                cache.update_and_fetch(new[0], new[1])
                outs.append(ragged_decode_attention(queries, cache, 128**-0.5))
            result = mx.sum(mx.stack(outs).astype(mx.float32))
            mx.async_eval(result)  # type: ignore[no-untyped-call]
            if previous is not None:
                previous.item()
            previous = result
            if step >= 4:
                times.append(time.perf_counter() - start)
        assert previous is not None
        previous.item()
        return {
            "ms_per_step": round(1000 * statistics.median(times), 3),
            "peak_gb": round(mx.get_peak_memory() / 1e9, 2),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--context", default="500:1000", help="prompt tokens a row, lo:hi")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not on_cuda():
        sys.exit("the in-place write is CUDA's: run this on the GPU machine")
    rng = random.Random(0)
    result: dict[str, Any] = {"device": str(mx.default_device())}
    if args.check:
        cases = check_cases(rng)
        for first, second, eager in [
            (True, False, False),
            (False, False, False),
            (True, True, False),
            (True, False, True),
        ]:
            differing = [
                (i, mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).tolist())
                for i, (a, b) in enumerate(
                    zip(
                        batch_life(first, eager=eager), batch_life(second, eager=eager), strict=True
                    )
                )
                if not bool(mx.array_equal(a, b).item())
            ]
            cases.append(
                {
                    "batch_life": f"{first} against {second}" + (", eager" if eager else ""),
                    "differing (item, max difference)": differing,
                    "ok": not differing,
                }
            )
        result["check"] = {"all_ok": all(c["ok"] for c in cases), "cases": cases}
        print("check:", "all ok" if result["check"]["all_ok"] else cases)
    lo, hi = (int(x) for x in args.context.split(":"))
    lengths = [rng.randint(lo, hi) for _ in range(args.rows)]
    runs = []
    for round_ in range(args.rounds):
        for mode in ("copy", "in-place") if round_ % 2 == 0 else ("in-place", "copy"):
            run = {"mode": mode, **decode_loop(mode, args.rows, lengths, args.layers, args.steps)}
            print(run)
            runs.append(run)
    result["runs"] = runs
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
