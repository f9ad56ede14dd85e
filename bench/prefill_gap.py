"""A running stream's worst gap while a long prompt is prefilled beside it (issue 29).

One stream decodes; once it has produced `--warm-tokens`, a long prompt (`--prompt-tokens`)
arrives and is prefilled in chunks beside it, each engine step running the stream's
decode and one chunk. Measured on the Trio side, as a client of the engine sees it:
  - the stream's worst and median gap between two tokens while the prompt is prefilled
    (every gap that overlaps the time from the prompt's submission to its first token),
    and its median gap before the prompt arrived (its pace alone);
  - the prompt's time to first token (what smaller chunks cost it);
  - the chunks the engine ran beside the stream, by size, and its cost per prefilled token.

Two engines in one process, one with chunks of `--prefill-step-size` always
(`prefill_chunk_ms=0`, the behaviour before the time budget) and one with the budget
(`--budget-ms`, default: the backend's), run the same trials alternately, the order
mirrored each round; each trial's prompts are new (no prefix-cache hits). Ratios are
old over new, per round, then the median.

Usage:
  python -P bench/prefill_gap.py --preset small --rounds 3
  python -P bench/prefill_gap.py --model /tmp/l8b --dtype bfloat16 --rounds 5
Random weights: EOS is ignored and max_tokens fixed (offline-models.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import trio

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.models import release_mlx_streams
from mlx_nursery.tools import make_model

GREEDY = SamplingParams(temperature=0.0)
KEYS = ("worst_gap_s", "median_gap_during_s", "median_gap_alone_s", "prompt_ttft_s")
"""What the summary gives the median of over the rounds, per engine."""
AFTER_TOKENS = 2
"""Stream tokens awaited after the prompt's first token: the gap that ends after it counts."""


def prompt_ids(n: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, min(vocab, 4000)) for _ in range(n)]


async def trial(engine: Engine, args: argparse.Namespace, seed: int, vocab: int) -> dict[str, Any]:
    """One stream, then the long prompt beside it; the stream is cancelled once the prompt
    has its first token and the stream two more tokens."""
    stamps: list[float] = []
    wanted = [args.warm_tokens]
    reached = trio.Event()
    stream_request = GenerationRequest(
        prompt_ids(args.stream_prompt_tokens, seed, vocab),
        max_tokens=args.stream_tokens,
        sampling=GREEDY,
        ignore_eos=True,
    )
    long_request = GenerationRequest(
        prompt_ids(args.prompt_tokens, seed + 1, vocab),
        max_tokens=1,
        sampling=GREEDY,
        ignore_eos=True,
    )

    async def stream() -> None:
        async with engine.generate(stream_request) as events:
            async for event in events:
                if event.token_id is None and not event.is_final:
                    continue
                stamps.append(time.perf_counter())
                if len(stamps) >= wanted[0]:
                    reached.set()
        reached.set()  # ended (it should not have, before the prompt's first token)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        await reached.wait()
        wanted[0] = args.stream_tokens + 1  # none until the prompt has its first token
        reached = trio.Event()
        before = engine.statistics().worker
        submitted = time.perf_counter()
        async with engine.generate(long_request) as events:
            async for _ in events:
                pass
        first_token = time.perf_counter()  # max_tokens=1: the final event is the first token
        ended_early = len(stamps) >= args.stream_tokens
        wanted[0] = len(stamps) + AFTER_TOKENS
        if not ended_early:
            await reached.wait()
        nursery.cancel_scope.cancel()
    after = engine.statistics().worker
    assert before is not None and after is not None
    gaps = list(itertools.pairwise(stamps))
    during = [b - a for a, b in gaps if b > submitted and a < first_token]
    alone = [b - a for a, b in gaps if b <= submitted][1:]  # the first includes the handover
    chunks = {
        size: count - before.prefill_chunks_beside_decode.get(size, 0)
        for size, count in after.prefill_chunks_beside_decode.items()
        if count > before.prefill_chunks_beside_decode.get(size, 0)
    }
    return {
        "worst_gap_s": max(during) if during else float("nan"),
        "median_gap_during_s": statistics.median(during) if during else float("nan"),
        "median_gap_alone_s": statistics.median(alone) if alone else float("nan"),
        "stream_tokens_during_prefill": len(during),
        "prompt_ttft_s": first_token - submitted,
        "chunks_beside_decode": dict(sorted(chunks.items())),
        "seconds_per_token": after.prefill_seconds_per_token,
        "stream_ended_early": ended_early,
    }


async def run(args: argparse.Namespace, model_path: Path, vocab: int) -> dict[str, Any]:
    common = {
        "max_concurrency": 8,
        "prompt_cache_bytes": 0,
        "prefill_step_size": args.prefill_step_size,
    }
    old_config = EngineConfig(model_path, prefill_chunk_ms=0, **common)
    new_config = EngineConfig(model_path, prefill_chunk_ms=args.budget_ms, **common)
    trials: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    async with open_engine(old_config) as old, open_engine(new_config) as new:
        engines = {"old": old, "new": new}
        await trial(old, args, 0, vocab)  # untimed: the first trial of each builds shapes
        await trial(new, args, 0, vocab)
        for round_ in range(args.rounds):
            order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
            for name in order:
                seed = 1000 * (round_ + 1) + (name == "new")
                trials[name].append(await trial(engines[name], args, seed, vocab))
                print(f"round {round_ + 1} {name}: {json.dumps(trials[name][-1])}", flush=True)
    ratios = {
        "worst_gap_old_over_new": [
            o["worst_gap_s"] / n["worst_gap_s"]
            for o, n in zip(trials["old"], trials["new"], strict=True)
        ],
        "prompt_ttft_new_over_old": [
            n["prompt_ttft_s"] / o["prompt_ttft_s"]
            for o, n in zip(trials["old"], trials["new"], strict=True)
        ],
    }
    summary = {
        name: {key: statistics.median(t[key] for t in runs) for key in KEYS}
        for name, runs in trials.items()
    }
    return {
        "trials": trials,
        "summary": summary,
        "ratios": ratios,
        "median_ratios": {key: statistics.median(values) for key, values in ratios.items()},
    }


def print_table(meta: dict[str, Any], results: dict[str, Any]) -> None:
    print(f"\n{meta['model']} ({meta['dtype']}) on {meta['device']}, {meta['date']}")
    heads = ("worst gap s", "median gap s", "alone gap s", "prompt TTFT s")
    print(f"{'':<8}" + "".join(f"{head:>15}" for head in heads) + "  chunks beside decode")
    for name in ("old", "new"):
        row = results["summary"][name]
        chunks = results["trials"][name][-1]["chunks_beside_decode"]
        print(f"{name:<8}" + "".join(f"{row[key]:>15.3f}" for key in KEYS) + f"  {chunks}")
    for key, value in results["median_ratios"].items():
        rounds = ", ".join(f"{r:.2f}" for r in results["ratios"][key])
        print(f"{key}: {value:.2f} (per round: {rounds})")


def commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", help="existing model directory (default: make one from --preset)"
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt-tokens", type=int, default=1143, help="the long prompt")
    parser.add_argument("--stream-prompt-tokens", type=int, default=32)
    parser.add_argument("--stream-tokens", type=int, default=4000, help="the stream's max_tokens")
    parser.add_argument(
        "--warm-tokens", type=int, default=8, help="stream tokens before the prompt"
    )
    parser.add_argument("--prefill-step-size", type=int, default=512)
    parser.add_argument(
        "--budget-ms", type=float, default=None, help="the new engine's (default: the backend's)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/prefill_gap.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_path = (
            Path(args.model)
            if args.model
            else make_model(Path(tmp) / args.preset, args.preset, dtype=args.dtype)
        )
        vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
        meta = {
            "model": args.model or f"preset {args.preset}",
            "dtype": args.dtype,
            "device": str(mx.default_device()),
            "machine": platform.platform(),
            "date": time.strftime("%Y-%m-%d"),
            "commit": commit(),
            "args": vars(args),
        }
        results = trio.run(run, args, model_path, vocab)
    print_table(meta, results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\nwrote {out}")
    release_mlx_streams()


if __name__ == "__main__":
    main()
