"""Constrained decoding cost: tok/s with and without a json_schema constraint, 1 and 32 streams.

Runs the engine in-process on one model; the constraint is the same llguidance processor the
server attaches for `response_format` (one matcher per sequence). The schema is unbounded
enough (long strings) that no sequence finishes early: every stream generates --tokens.

Usage:
  python bench/structured.py --preset small
  python bench/structured.py --model PATH
"""

from __future__ import annotations

import sys

# See bench/engine.py: keep bench/http.py from shadowing the standard library's `http`.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import trio

from mlx_nursery.engine import EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.generation import Grammars

SCHEMA = {
    "type": "object",
    "properties": {
        "story": {"type": "string"},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["story", "notes"],
}


async def run(model: Path, streams: int, tokens: int, constrained: bool, vocab: int) -> float:
    async with open_engine(
        EngineConfig(model, max_concurrency=streams, prompt_cache_bytes=0)
    ) as engine:
        tokenizer = engine.model.tokenizer
        grammars = Grammars(tokenizer, vocab)
        prompt = tokenizer.encode("Tell me a long story about the sea.")

        def request(i: int) -> GenerationRequest:
            processors = (grammars.json_processor(SCHEMA, "bench"),) if constrained else ()
            return GenerationRequest(
                prompt,
                tokens,
                sampling=SamplingParams(temperature=1.0, seed=i),
                ignore_eos=not constrained,
                logits_processors=processors,
            )

        async def one(i: int, counts: list[int]) -> None:
            async with engine.generate(request(i)) as stream:
                async for event in stream:
                    if event.usage is not None:
                        counts.append(event.usage.completion_tokens)

        await one(0, [])  # warm-up
        counts: list[int] = []
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(streams):
                nursery.start_soon(one, i + 1, counts)
        return sum(counts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", default="bench/results/structured.json")
    args = parser.parse_args()
    model = (
        Path(args.model)
        if args.model
        else Path(tempfile.gettempdir()) / f"mlx-nursery-bench-{args.preset}"
    )
    if not (model / "config.json").exists():
        from mlx_nursery.tools import make_model

        make_model(model, args.preset)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    rows = []
    for streams in (1, 32):
        free = trio.run(run, model, streams, args.tokens, False, vocab)
        constrained = trio.run(run, model, streams, args.tokens, True, vocab)
        rows.append(
            {
                "streams": streams,
                "free_tps": free,
                "constrained_tps": constrained,
                "ratio": constrained / free,
            }
        )
    print(
        f"\nmodel {model.name}, {args.tokens} tokens per stream, temperature 1,"
        " json_schema constraint"
    )
    print("streams | unconstrained tok/s | constrained tok/s | constrained / unconstrained")
    for row in rows:
        print(
            f"{row['streams']:7d} | {row['free_tps']:19.1f} | {row['constrained_tps']:17.1f}"
            f" | {row['ratio']:.3f}"
        )
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.platform(),
        "model": str(model),
        "args": vars(args),
        "rows": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    try:
        main()
    finally:
        from mlx_nursery.models import release_mlx_streams

        release_mlx_streams()
