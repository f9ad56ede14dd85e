"""Prefix cache on disk (`--prompt-cache-dir`): a long prompt's time to first token cold,
from disk after a restart, and from memory after that.

Each round, with a fresh directory and a prefix of its own (`--prefix-tokens` random ids):
  1. cold: an engine serves prefix + question 1 (nothing cached), then closes (its disk
     write done: the close waits for it);
  2. disk: a fresh engine on the same directory (a restart) serves prefix + question 2: the
     prefix is read from disk on the disk tier's reader thread and copied into MLX;
  3. memory: the same engine serves prefix + question 3: the memory tier holds question 2's
     sequence, as before this server had a disk tier.
TTFT is from the request to its first token, in process (no HTTP). Greedy; the outputs of
the disk and memory runs are checked against a cold run of the same prompt in the first
engine (`same`). One unreported round first builds the kernels of these shapes.

Usage:
  python -P bench/prompt_cache_disk.py --preset small                  # CPU: 2048 tokens
  python -P bench/prompt_cache_disk.py --model /tmp/l8b --prefix-tokens 16384 --rounds 5
Random weights: EOS is ignored and max_tokens fixed (offline-models.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import trio

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.models import release_mlx_streams
from mlx_nursery.tools import make_model

GREEDY = SamplingParams(temperature=0.0)
QUESTION_TOKENS = 16
NEW_TOKENS = 8


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(n)]


async def first_token(engine: Engine, prompt: list[int]) -> dict[str, Any]:
    """Serve `prompt`; its TTFT, tokens and cached tokens."""
    request = GenerationRequest(prompt, max_tokens=NEW_TOKENS, sampling=GREEDY, ignore_eos=True)
    started = time.perf_counter()
    ttft = None
    tokens: list[int] = []
    async with engine.generate(request) as events:
        async for event in events:
            if event.token_id is not None:
                ttft = ttft or time.perf_counter() - started
                tokens.append(event.token_id)
            usage = event.usage
    assert ttft is not None and usage is not None
    return {"ttft_s": ttft, "tokens": tokens, "cached_tokens": usage.cached_tokens}


async def one_round(args: argparse.Namespace, model: Path, seed: int) -> dict[str, Any]:
    prefix = ids(args.prefix_tokens, seed)
    prompts = [prefix + ids(QUESTION_TOKENS, seed * 10 + q) for q in range(3)]
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        config = EngineConfig(
            model,
            warmup=False,
            prompt_cache_dir=Path(directory),
            prefill_step_size=args.prefill_step_size,
            prompt_cache_bytes=args.prompt_cache_bytes,
            prompt_cache_disk_read_rate=args.disk_read_rate,
        )
        async with open_engine(config) as engine:
            cold = await first_token(engine, prompts[0])
            references = [
                await first_token(engine, p)
                for p in prompts[1:]  # memory hits here: only their tokens are compared
            ]
            closing = time.perf_counter()
        close_s = time.perf_counter() - closing  # its disk writes are part of it
        written = _sizes(Path(directory))
        async with open_engine(config) as engine:
            disk = await first_token(engine, prompts[1])
            memory = await first_token(engine, prompts[2])
            stats = engine.statistics().worker
    assert stats is not None and stats.prefix_disk is not None
    return {
        "cold": cold,
        "disk": disk,
        "memory": memory,
        "same": [
            disk["tokens"] == references[0]["tokens"],
            memory["tokens"] == references[1]["tokens"],
        ],
        "file_bytes": sum(written),
        "files": len(written),
        "first_close_s": close_s,
        "disk_hits": stats.prefix_disk.hits,
        "disk_skipped_slower": stats.prefix_disk.skipped_slower,
        "read_gb_s": (stats.prefix_disk.read_bytes_per_second or 0) / 1e9,
        "memory_too_large": stats.prefix_cache.too_large if stats.prefix_cache else None,
    }


def _sizes(directory: Path) -> list[int]:
    return [path.stat().st_size for path in directory.iterdir()]


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tier in ("cold", "disk", "memory"):
        out[f"{tier}_ttft_s"] = statistics.median(r[tier]["ttft_s"] for r in rounds)
        out[f"{tier}_cached_tokens"] = rounds[-1][tier]["cached_tokens"]
    out["disk_speedup"] = out["cold_ttft_s"] / out["disk_ttft_s"]
    out["memory_speedup"] = out["cold_ttft_s"] / out["memory_ttft_s"]
    out["all_same"] = all(all(r["same"]) for r in rounds)
    out["file_bytes"] = rounds[-1]["file_bytes"]
    out["read_gb_s"] = statistics.median(r["read_gb_s"] for r in rounds)
    out["disk_skipped_slower"] = sum(r["disk_skipped_slower"] for r in rounds)
    out["memory_too_large"] = rounds[-1]["memory_too_large"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="existing model directory (default: make --preset)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default=None, help="the preset's dtype (default: its own)")
    gpu = mx.default_device().type == mx.DeviceType.gpu
    parser.add_argument(
        "--prefix-tokens", type=int, default=16384 if gpu else 2048, help="GPU 16384, CPU 2048"
    )
    parser.add_argument("--prefill-step-size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--prompt-cache-bytes",
        type=int,
        default=attrs.fields(EngineConfig).prompt_cache_bytes.default,
        help="the in-memory prefix cache's bound (default 2 GiB: below an 8B model's 16K"
        " tokens, which memory then never holds)",
    )
    parser.add_argument(
        "--disk-read-rate",
        type=float,
        default=None,
        help="bytes/s a disk read is expected at before one is measured (default: none, the"
        " restart's first read is taken and measured)",
    )
    parser.add_argument("--dir", default=None, help="where the cache directories go (a disk)")
    parser.add_argument("--out", default="bench/results/prompt_cache_disk.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        options = {"dtype": args.dtype} if args.dtype else {}
        model = (
            Path(args.model)
            if args.model
            else make_model(Path(tmp) / args.preset, args.preset, **options)
        )
        trio.run(one_round, args, model, 0)  # the kernels of these shapes, off the record
        rounds = [trio.run(one_round, args, model, seed) for seed in range(1, args.rounds + 1)]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    meta = {
        "model": args.model or f"preset {args.preset}",
        "device": str(mx.default_device()),
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "args": vars(args),
    }
    result = summary(rounds)
    print(f"\nprefix cache on disk: {meta['model']} on {meta['device']}, {commit}")
    print(f"prefix {args.prefix_tokens} tokens + {QUESTION_TOKENS}, median of {args.rounds}")
    for tier in ("cold", "disk", "memory"):
        ttft = result[f"{tier}_ttft_s"] * 1000
        cached = result[f"{tier}_cached_tokens"]
        print(f"{tier:>7}: TTFT {ttft:9.1f} ms  cached {cached:>6}")
    print(
        f"disk {result['disk_speedup']:.1f}x, memory {result['memory_speedup']:.1f}x faster than"
        f" cold; same tokens: {result['all_same']}; files {result['file_bytes']} bytes"
    )
    print(
        f"disk read (read, checked, copied into MLX) {result['read_gb_s']:.2f} GB/s;"
        f" reads skipped as slower than prefill {result['disk_skipped_slower']};"
        f" entries too large for memory {result['memory_too_large']}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "summary": result, "rounds": rounds}, indent=2))
    print(f"wrote {out}")
    release_mlx_streams()


if __name__ == "__main__":
    main()
