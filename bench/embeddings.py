"""Embedding engine benchmark: prints a table and writes JSON.

Measures, on one embedding model in one process (the engine, no HTTP):
  1. inputs/s of one request of many inputs (batched by the engine's bounds);
  2. inputs/s of many one-input requests arriving together, batched (the default bounds)
     vs one input per forward (`max_batch_inputs=1`): what sharing forwards buys;
  3. cancellation: forwards between a cancel and its confirmation (the bound is one).

Usage:
  python bench/embeddings.py --preset tiny-embedding             # CPU, quick
  python bench/embeddings.py --preset bert-base --dtype bfloat16 --requests 256
Random weights: the vectors mean nothing; their cost is real.
"""

from __future__ import annotations

import sys

# bench/http.py would shadow the standard library's `http` package: drop this folder.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from mlx_nursery.engine import Embedder, EmbedderConfig, EmbeddingRequest
from mlx_nursery.tools import make_model


async def _throughput(config: EmbedderConfig, requests: list[EmbeddingRequest]) -> float:
    async with trio.open_nursery() as nursery:
        embedder: Embedder = await nursery.start(Embedder(config).run)
        await embedder.embed(requests[0])  # builds the kernels for the shape first
        began = time.perf_counter()
        async with trio.open_nursery() as clients:
            for request in requests:
                clients.start_soon(embedder.embed, request)
        seconds = time.perf_counter() - began
        embedder.close()
    return sum(len(r.inputs) for r in requests) / seconds


async def _cancel_forwards(config: EmbedderConfig, tokens: int) -> list[int]:
    """Forwards between cancel and confirmation, for 20 cancels of a long request."""
    async with trio.open_nursery() as nursery:
        embedder: Embedder = await nursery.start(Embedder(config).run)
        long = EmbeddingRequest([[7] * tokens] * 4096)
        for _ in range(20):
            with trio.move_on_after(0.05):
                await embedder.embed(long)
        stats = embedder.statistics().cancellations
        embedder.close()
    return list(stats.steps_in_flight)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        model = make_model(Path(folder) / args.preset, args.preset, dtype=args.dtype)
        ids = [7] * args.tokens
        base = EmbedderConfig(model, max_concurrency=args.requests, max_queue=args.requests)
        one = [EmbeddingRequest([ids] * args.requests)]
        many = [EmbeddingRequest([ids]) for _ in range(args.requests)]
        unbatched = EmbedderConfig(model, max_concurrency=args.requests, max_batch_inputs=1)
        return {
            "preset": args.preset,
            "dtype": args.dtype,
            "tokens_per_input": args.tokens,
            "requests": args.requests,
            "machine": platform.platform(),
            "one_request_inputs_per_s": await _throughput(base, one),
            "together_batched_inputs_per_s": await _throughput(base, many),
            "together_one_per_forward_inputs_per_s": await _throughput(unbatched, many),
            "cancel_forwards_in_flight_counts": await _cancel_forwards(base, args.tokens),
        }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny-embedding")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per input")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--out", default="bench-embeddings.json")
    result = trio.run(main, parser.parse_args())
    for key, value in result.items():
        print(f"{key:42} {value}")
    Path(parser.parse_args().out).write_text(json.dumps(result, indent=2))
