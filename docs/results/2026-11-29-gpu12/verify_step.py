"""A lone sequence's verify forward (speculative decoding's step on the fast path), timed with
the short-query attention split into MLX's vector kernel calls and without (MLX's fallback),
alternating in one process: the host's launch time and the whole step's.

  python -P bench/verify_step.py --model DIR --context 600 --positions 1 5 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import mlx.core as mx

from mlx_nursery.engine import _decode_attention
from mlx_nursery.engine._upstream import make_prompt_cache, trim_prompt_cache
from mlx_nursery.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--positions", type=int, nargs="+", default=[1, 5, 9])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
    model = load_model(args.model).model
    _decode_attention.install(model)
    cache = make_prompt_cache(model)
    model(mx.arange(args.context, dtype=mx.uint32)[None] % 1000, cache=cache)
    mx.eval([c.state for c in cache])
    split_limit = _decode_attention._SHORT_QUERIES
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.blocks):
        for split in (True, False):
            _decode_attention._SHORT_QUERIES = split_limit if split else 0
            for positions in args.positions:
                row = results.setdefault(f"{positions} {'split' if split else 'fallback'}", {})
                inputs = mx.arange(positions, dtype=mx.uint32)[None] + 7
                for _ in range(args.steps):
                    start = time.perf_counter()
                    logits = model(inputs, cache=cache)
                    token = mx.argmax(logits[0], axis=-1)
                    built = time.perf_counter()
                    mx.async_eval(token)
                    launched = time.perf_counter()
                    mx.eval(token)
                    done = time.perf_counter()
                    trim_prompt_cache(cache, positions)
                    for key, value in (
                        ("build", built - start),
                        ("launch", launched - built),
                        ("step", done - start),
                    ):
                        row.setdefault(key, []).append(1000 * value)
    summary = {
        name: {key: round(statistics.median(values), 3) for key, values in row.items()}
        for name, row in results.items()
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
