"""Rerank benchmark: documents per second of one /v1/rerank request, in process (no HTTP).

Runs what the route runs for one request of a query and `--documents` documents: the
request prepared (validated, each pair framed and tokenized: `prepare_rerank`), its pairs
computed on the model's engine in forwards of `--batch-size` pairs (each size an engine of
its own), the body written (scores, sorted). Prints a table and writes JSON: documents/s
end to end, and the time in each part. A cross-encoder scores pairs; an embedding model
(e.g. `--preset bert-base`) embeds each text once and scores by cosine.

Usage:
  python -P bench/rerank.py                                   # tiny-reranker, quick
  python -P bench/rerank.py --preset bge-reranker-base --documents 16 --batch-size 1 8
(a pair is the query's and a document's tokens and the special ones: within 128 for the tiny
preset, 512 for bge-reranker-base.)
Random weights: the scores mean nothing; their cost is real.
"""

from __future__ import annotations

import sys

# bench/http.py would shadow the standard library's `http` package: drop this folder.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from mlx_nursery.engine import Embedder, EmbedderConfig
from mlx_nursery.openai import EmbeddingLimits, ServedEmbedder, prepare_rerank, rerank_body
from mlx_nursery.tools import make_model

WORDS = "the capital of a country is where its government sits and most of its people work"


def _text(tokenizer: Any, tokens: int, offset: int) -> str:
    """Words in a fixed order, as many as make `tokens` tokens (without special ones)."""
    vocabulary, backend = WORDS.split(), tokenizer.backend_tokenizer
    words: list[str] = []
    while len(backend.encode(" ".join(words), add_special_tokens=False).ids) < tokens:
        words.append(vocabulary[(offset + len(words)) % len(vocabulary)])
    return " ".join(words)


def _served(embedder: Embedder) -> ServedEmbedder:
    spec = embedder.model.spec
    return ServedEmbedder(
        name="bench",
        aliases=frozenset(),
        created=0,
        tokenizer=embedder.model.tokenizer,
        context_length=spec.context_length,
        vocab_size=spec.vocab_size,
        dimensions=spec.dimensions,
        matryoshka=spec.matryoshka,
        limits=EmbeddingLimits(max_documents=1 << 20),
        classifier=spec.classifier,
    )


async def _run(config: EmbedderConfig, args: argparse.Namespace) -> dict[str, Any]:
    async with trio.open_nursery() as nursery:
        embedder: Embedder = await nursery.start(Embedder(config).run)
        served = _served(embedder)
        tokenizer = served.tokenizer
        query = _text(tokenizer, args.query_tokens, 0)
        documents = [_text(tokenizer, args.doc_tokens, i + 1) for i in range(args.documents)]
        body = {"model": "bench", "query": query, "documents": documents}
        warm = {"model": "bench", "query": query, "documents": documents[: args.batch]}
        prepared = prepare_rerank(warm, served)  # builds the kernels for the shape first
        rerank_body(prepared, await embedder.embed(prepared.scoring.request))
        began = time.perf_counter()
        prepared = prepare_rerank(body, served)
        tokenized = time.perf_counter()
        forwards = embedder.forwards
        rows = await embedder.embed(prepared.scoring.request)
        computed = time.perf_counter()
        written = rerank_body(prepared, rows)
        ended = time.perf_counter()
        embedder.close()
    return {
        "batch_size": args.batch,
        "documents_per_s": args.documents / (ended - began),
        "tokens": prepared.scoring.request.tokens,
        "forwards": embedder.forwards - forwards,
        "prepare_s": tokenized - began,
        "compute_s": computed - tokenized,
        "body_s": ended - computed,
        "body_bytes": len(written),
    }


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return out.stdout.strip()
    except OSError:
        return ""


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        model = Path(args.model) if args.model else None
        if model is None:
            model = make_model(Path(folder) / args.preset, args.preset, dtype=args.dtype)
        runs = []
        for batch in args.batch_size:
            args.batch = batch
            longest = args.query_tokens + args.doc_tokens + 8
            config = EmbedderConfig(
                model, max_batch_inputs=batch, max_batch_tokens=max(batch * longest, 8192)
            )
            runs.append(await _run(config, args))
    return {
        "preset": args.model or args.preset,
        "dtype": args.dtype,
        "documents": args.documents,
        "query_tokens": args.query_tokens,
        "doc_tokens": args.doc_tokens,
        "machine": platform.platform(),
        "commit": _commit(),
        "runs": runs,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny-reranker")
    parser.add_argument("--model", help="a model directory (instead of making --preset)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--documents", type=int, default=64)
    parser.add_argument("--query-tokens", type=int, default=16)
    parser.add_argument("--doc-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[32], help="pairs a forward")
    parser.add_argument("--out", default="bench/results/rerank.json")
    options = parser.parse_args()
    result = trio.run(main, options)
    print(f"{result['preset']}, {result['documents']} documents of {result['doc_tokens']} tokens")
    print(f"{'batch':>6} {'docs/s':>9} {'prepare s':>10} {'compute s':>10} {'body s':>8}")
    for run in result["runs"]:
        print(
            f"{run['batch_size']:>6} {run['documents_per_s']:>9.2f} {run['prepare_s']:>10.3f}"
            f" {run['compute_s']:>10.3f} {run['body_s']:>8.4f}"
        )
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(result, indent=2))
