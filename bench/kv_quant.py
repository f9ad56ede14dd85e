"""Quantized KV cache benchmark (`--kv-bits`): memory saved and decode speed lost.

For each setting (unquantized, 8 bits, 4 bits), in one process, on one model:
  1. KV bytes per token, as the engine measures them for its KV budget, and the tokens a
     fixed KV memory (`--kv-gib`) holds;
  2. decode tok/s at each batch size (`--batch`; 1 runs on the single-sequence fast path,
     more in mlx-lm's BatchGenerator): `B` streams of `--prompt-tokens` start together and
     decode `--tokens` each; the rate is the tokens emitted while all `B` decode (after the
     last first token, before the first finish), over that window;
  3. how many streams' first 16 greedy tokens equal the unquantized run's (with random
     weights, a check that quantized attention computes right on this backend);
  4. the KV memory the batch really held then: MLX's largest active memory sampled in
     that window (prefill's transients are over by then), less the engine's idle memory
     (the weights) before the wave. It includes a step's own transients (logits): read it
     beside the bytes per token.

Ratios are against the unquantized run of the same process. On the CPU (the `small`
preset, head dimension 32: `--kv-group-size 32`) read only ratios; absolute speeds count on
the GPU machine (docs/benchmarks.md, "Quantized KV cache").

Usage:
  python -P bench/kv_quant.py --preset small --kv-group-size 32 --batch 1 8 --tokens 32
  python -P bench/kv_quant.py --model /tmp/l8b --prompt-tokens 2048 --batch 1 8 32
Random weights: EOS is ignored and max_tokens fixed (offline-models.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
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
SETTINGS: tuple[int | None, ...] = (None, 8, 4)
AGREEMENT_TOKENS = 16
"""Greedy tokens per stream compared with the unquantized run's (a check that quantized
attention computes what it should on this backend, not a quality measure: random weights)."""


def prompt_ids(n: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, min(vocab, 4000)) for _ in range(n)]


async def wave(engine: Engine, batch: int, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """`batch` streams started together; the decode rate while all of them decode."""
    stamps: list[list[float]] = [[] for _ in range(batch)]
    tokens_out: list[list[int]] = [[] for _ in range(batch)]
    memory: list[tuple[float, int]] = []
    idle = mx.get_active_memory()

    async def stream(i: int) -> None:
        request = GenerationRequest(
            prompt_ids(args.prompt_tokens, 1000 * batch + i, vocab),
            max_tokens=args.tokens,
            sampling=GREEDY,
            ignore_eos=True,
        )
        async with engine.generate(request) as events:
            async for event in events:
                if event.token_id is not None:
                    stamps[i].append(time.perf_counter())
                    tokens_out[i].append(event.token_id)

    async def sample_memory() -> None:
        while True:
            memory.append((time.perf_counter(), mx.get_active_memory()))
            await trio.sleep(0.05)

    async with trio.open_nursery() as outer:
        outer.start_soon(sample_memory)
        async with trio.open_nursery() as nursery:
            for i in range(batch):
                nursery.start_soon(stream, i)
        outer.cancel_scope.cancel()
    start = max(s[0] for s in stamps)  # every stream decodes from here...
    end = min(s[-1] for s in stamps)  # ...to here
    tokens = sum(1 for s in stamps for t in s if start < t <= end)
    rate = tokens / (end - start) if end > start else float("nan")
    decoding = [held for when, held in memory if start <= when <= end]  # no prefill transients
    return {
        "batch": batch,
        "decode_tok_s": rate,
        "window_s": end - start,
        "kv_bytes_held": max(decoding, default=idle) - idle,
        "first_tokens": [t[:AGREEMENT_TOKENS] for t in tokens_out],
    }


async def measure(args: argparse.Namespace, model_path: Path, bits: int | None) -> dict[str, Any]:
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    kv_bytes = int(args.kv_gib * (1 << 30))
    config = EngineConfig(
        model_path,
        max_concurrency=max(args.batch),
        max_queue=256,
        prompt_cache_bytes=0,  # every wave prefills: no entry outlives it in memory
        kv_cache_bytes=kv_bytes,
        kv_bits=bits,
        kv_group_size=args.kv_group_size,
    )
    async with open_engine(config) as engine:
        tokens = engine.model.kv_budget_tokens
        assert tokens is not None
        await wave(engine, max(args.batch), args, vocab)  # kernels for these shapes, off the clock
        waves = [await wave(engine, batch, args, vocab) for batch in args.batch]
    return {
        "kv_bits": bits,
        "kv_budget_tokens": tokens,
        "kv_bytes_per_token": kv_bytes / tokens,
        "waves": waves,
    }


def with_ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = results[0]
    for result in results:
        result["bytes_ratio"] = result["kv_bytes_per_token"] / base["kv_bytes_per_token"]
        for wave_, reference in zip(result["waves"], base["waves"], strict=True):
            wave_["speed_ratio"] = wave_["decode_tok_s"] / reference["decode_tok_s"]
            pairs = list(zip(wave_["first_tokens"], reference["first_tokens"], strict=True))
            wave_["streams_agreeing"] = sum(a == b for a, b in pairs) / len(pairs)
            wave_["held_ratio"] = (
                wave_["kv_bytes_held"] / reference["kv_bytes_held"]
                if reference["kv_bytes_held"] > 0
                else float("nan")
            )
    return results


def print_table(meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    print(f"\nquantized KV: {meta['model']} ({meta['dtype']}) on {meta['device']}")
    print(f"prompt {meta['args']['prompt_tokens']} tokens, {meta['args']['tokens']} decoded")
    print(
        f"{'bits':>5} {'B/token':>9} {'x':>5}  "
        + "  ".join(
            f"{'b' + str(w['batch']) + ' tok/s':>11} {'x':>5} {'KV held':>9} {'same':>5}"
            for w in results[0]["waves"]
        )
    )
    for r in results:
        cells = "  ".join(
            f"{w['decode_tok_s']:>11.1f} {w['speed_ratio']:>5.2f}"
            f" {w['kv_bytes_held'] / 2**20:>7.1f}Mi {w['streams_agreeing']:>5.2f}"
            for w in r["waves"]
        )
        bits = "none" if r["kv_bits"] is None else str(r["kv_bits"])
        print(f"{bits:>5} {r['kv_bytes_per_token']:>9.0f} {r['bytes_ratio']:>5.2f}  {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", help="existing model directory (default: make one from --preset)"
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-group-size", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--kv-gib", type=float, default=16.0, help="the engines' KV budget")
    parser.add_argument("--out", default="bench/results/kv_quant.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_path = (
            Path(args.model)
            if args.model
            else make_model(Path(tmp) / args.preset, args.preset, dtype=args.dtype)
        )
        meta = {
            "model": args.model or f"preset {args.preset}",
            "dtype": args.dtype,
            "device": str(mx.default_device()),
            "machine": platform.platform(),
            "date": time.strftime("%Y-%m-%d"),
            "args": vars(args),
        }
        results = with_ratios([trio.run(measure, args, model_path, bits) for bits in SETTINGS])
    print_table(meta, results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\nwrote {out}")
    release_mlx_streams()


if __name__ == "__main__":
    main()
