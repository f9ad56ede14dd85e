"""Engine benchmark: prints a table and writes JSON.

Measures, on one model in one process:
  1. single-stream decode tok/s: the engine vs raw mlx_lm generate_step (ratio);
  2. aggregate tok/s at 1, 8 and 32 concurrent streams, and 32 streams with
     max_concurrency=1 (serialized) vs 32 (batched);
  3. cancellation latency (cancel -> engine confirmation) p50/p99, steps in
     flight at cancel, and events computed after confirmation (must be 0);
  4. prefix cache: time to first token cold vs warm for a long shared prefix.

Usage:
  python bench/engine.py --preset small                      # CPU, quick
  python bench/engine.py --preset llama-3.1-8b --dtype bfloat16 --prefix-tokens 8192
Random weights: EOS is ignored and max_tokens fixed (offline-models.md).
"""

from __future__ import annotations

import sys

# bench/http.py would shadow the standard library's `http` package (imported by httpx,
# huggingface_hub, ...): run as a script, this folder is first on sys.path. Drop it.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import trio

from mlx_nursery.cli import release_mlx_streams
from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.models import make_model

GREEDY = SamplingParams(temperature=0.0)


def prompt_ids(n: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, min(vocab, 4000)) for _ in range(n)]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


# -- 1. single stream --------------------------------------------------------------------------
def raw_decode_tps(model_path: Path, prompt: list[int], tokens: int, repeats: int) -> list[float]:
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    model, _ = load(str(model_path))
    rates = []
    for _ in range(repeats + 1):  # first run warms up
        n, first = 0, 0.0
        for _token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens):
            n += 1
            if n == 1:
                first = time.perf_counter()
        rates.append((n - 1) / (time.perf_counter() - first))
    del model
    mx.clear_cache()
    return rates[1:]


async def engine_stream(engine: Engine, request: GenerationRequest) -> tuple[float, float, int]:
    """Return (time to first token, decode tok/s after the first token, tokens)."""
    start = time.perf_counter()
    first = last = 0.0
    n = 0
    async with engine.generate(request) as stream:
        async for event in stream:
            if event.token_id is None and not event.is_final:
                continue
            if event.usage is not None:
                n = event.usage.completion_tokens
            last = time.perf_counter()
            if not first:
                first = last
    return first - start, (n - 1) / (last - first) if last > first else float("nan"), n


async def engine_decode_tps(engine: Engine, prompt: list[int], tokens: int, repeats: int) -> list[float]:
    request = GenerationRequest(prompt, max_tokens=tokens, sampling=GREEDY, ignore_eos=True)
    rates = []
    for _ in range(repeats + 1):
        rates.append((await engine_stream(engine, request))[1])
    return rates[1:]


# -- 2. aggregate throughput -------------------------------------------------------------------
async def aggregate_tps(engine: Engine, streams: int, prompt_len: int, tokens: int, vocab: int) -> float:
    requests = [
        GenerationRequest(prompt_ids(prompt_len, i, vocab), max_tokens=tokens, sampling=GREEDY, ignore_eos=True)
        for i in range(streams)
    ]
    counts: list[int] = []

    async def one(request: GenerationRequest) -> None:
        counts.append((await engine_stream(engine, request))[2])

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for request in requests:
            nursery.start_soon(one, request)
    return sum(counts) / (time.perf_counter() - start)


# -- 3. cancellation ---------------------------------------------------------------------------
async def cancellation(engine: Engine, trials: int, background: int, vocab: int) -> dict[str, Any]:
    latencies: list[float] = []
    in_flight: list[int] = []
    step_times: list[float] = []
    budget = min(engine.model.context_length - 200, 4096)

    async def background_stream(i: int) -> None:
        request = GenerationRequest(prompt_ids(64, 1000 + i, vocab), max_tokens=budget, sampling=GREEDY, ignore_eos=True)
        async with engine.generate(request) as stream:
            async for _ in stream:
                pass

    async with trio.open_nursery() as nursery:
        for i in range(background):
            nursery.start_soon(background_stream, i)
        rng = random.Random(0)
        for t in range(trials):
            request = GenerationRequest(prompt_ids(64, t, vocab), max_tokens=budget, sampling=GREEDY, ignore_eos=True)
            stop_after = rng.randint(3, 20)
            with trio.CancelScope() as scope:
                async with engine.generate(request) as stream:
                    seen, previous = 0, 0.0
                    async for event in stream:
                        now = time.perf_counter()
                        if previous:
                            step_times.append(now - previous)
                        previous = now
                        seen += 1
                        if seen == stop_after:
                            cancelled_at = time.perf_counter()
                            scope.cancel()
                            break
                latencies.append(time.perf_counter() - cancelled_at)
                if stream.steps_in_flight_at_cancel is not None:
                    in_flight.append(stream.steps_in_flight_at_cancel)
        nursery.cancel_scope.cancel()
    stats = engine.statistics()
    return {
        "trials": trials,
        "background_streams": background,
        "latency_ms_p50": 1000 * percentile(latencies, 0.5),
        "latency_ms_p99": 1000 * percentile(latencies, 0.99),
        "decode_step_ms_p50": 1000 * median(step_times),
        "steps_in_flight_at_cancel_max": max(in_flight) if in_flight else None,
        "events_after_confirmation": stats.late_events,
        "lanes_borrowed_after": stats.lanes_borrowed,
    }


# -- 4. prefix cache ---------------------------------------------------------------------------
async def prefix_ttft(
    engine: Engine, prefix_tokens: int, vocab: int, repeats: int, offset: int = 0
) -> dict[str, float]:
    shared = prompt_ids(prefix_tokens, 4242, vocab)
    cold, warm = [], []
    for r in range(offset, offset + repeats):
        system = [10 + r] + shared[1:]  # differs from the start: nothing cached matches it
        for i, sink in ((0, cold), (1, warm)):
            question = prompt_ids(16, 7000 + 10 * r + i, vocab)
            request = GenerationRequest(system + question, max_tokens=2, sampling=GREEDY, ignore_eos=True)
            sink.append((await engine_stream(engine, request))[0])
    return {
        "prefix_tokens": prefix_tokens,
        "cold_ttft_ms": 1000 * median(cold),
        "warm_ttft_ms": 1000 * median(warm),
        "speedup": median(cold) / median(warm),
    }


async def run(args: argparse.Namespace, model_path: Path) -> dict[str, Any]:
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    prompt = prompt_ids(args.prompt_tokens, 1, vocab)
    results: dict[str, Any] = {}

    raw = raw_decode_tps(model_path, prompt, args.tokens, args.repeats)
    async with open_engine(EngineConfig(model_path, max_concurrency=32, max_queue=256)) as engine:
        # Warm-up: MLX's CUDA backend JIT-compiles kernels per shape; keep that out of the figures.
        for n in args.concurrency:
            await aggregate_tps(engine, n, args.prompt_tokens, 16, vocab)
        await prefix_ttft(engine, args.prefix_tokens, vocab, 1, offset=100)
        eng = await engine_decode_tps(engine, prompt, args.tokens, args.repeats)
        results["single_stream"] = {
            "raw_generate_step_tps": median(raw),
            "engine_tps": median(eng),
            "ratio": median(eng) / median(raw),
        }
        results["aggregate_tps"] = {
            str(n): await aggregate_tps(engine, n, args.prompt_tokens, args.tokens, vocab)
            for n in args.concurrency
        }
        results["cancellation"] = await cancellation(engine, args.cancel_trials, 7, vocab)
        results["prefix_cache"] = await prefix_ttft(engine, args.prefix_tokens, vocab, args.repeats)
    async with open_engine(EngineConfig(model_path, max_concurrency=1, max_queue=256)) as serial:
        serialized = await aggregate_tps(serial, 32, args.prompt_tokens, args.tokens, vocab)
    batched = results["aggregate_tps"].get("32")
    results["serialized_vs_batched_32"] = {
        "max_concurrency_1_tps": serialized,
        "max_concurrency_32_tps": batched,
        "ratio": batched / serialized if batched else None,
    }
    return results


def print_table(meta: dict[str, Any], r: dict[str, Any]) -> None:
    rows = [
        ("single stream: raw generate_step tok/s", r["single_stream"]["raw_generate_step_tps"]),
        ("single stream: engine tok/s", r["single_stream"]["engine_tps"]),
        ("single stream: engine / raw", r["single_stream"]["ratio"]),
        *[(f"aggregate tok/s, {n} streams", v) for n, v in r["aggregate_tps"].items()],
        ("32 streams, max_concurrency=1 tok/s", r["serialized_vs_batched_32"]["max_concurrency_1_tps"]),
        ("32 streams, batched / serialized", r["serialized_vs_batched_32"]["ratio"]),
        ("cancel -> confirmed p50 ms", r["cancellation"]["latency_ms_p50"]),
        ("cancel -> confirmed p99 ms", r["cancellation"]["latency_ms_p99"]),
        ("decode step p50 ms (8 streams)", r["cancellation"]["decode_step_ms_p50"]),
        ("steps in flight at cancel (max)", r["cancellation"]["steps_in_flight_at_cancel_max"]),
        ("events after confirmation", r["cancellation"]["events_after_confirmation"]),
        (f"prefix {r['prefix_cache']['prefix_tokens']} tok: cold TTFT ms", r["prefix_cache"]["cold_ttft_ms"]),
        ("prefix: warm TTFT ms", r["prefix_cache"]["warm_ttft_ms"]),
        ("prefix: cold / warm", r["prefix_cache"]["speedup"]),
    ]
    print(f"\nmlx-nursery engine benchmark: {meta['model']} ({meta['dtype']}) on {meta['device']}")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        shown = f"{value:,.2f}" if isinstance(value, float) else str(value)
        print(f"  {key:<{width}}  {shown:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="existing model directory (default: make one from --preset)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cancel-trials", type=int, default=30)
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--out", default="bench/results/engine.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_path = Path(args.model) if args.model else make_model(Path(tmp) / args.preset, args.preset, dtype=args.dtype)
        meta = {
            "model": args.model or f"preset {args.preset}",
            "dtype": args.dtype,
            "device": str(mx.default_device()),
            "machine": platform.platform(),
            "date": time.strftime("%Y-%m-%d"),
            "args": vars(args),
        }
        results = trio.run(run, args, model_path)
    print_table(meta, results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\nwrote {out}")
    release_mlx_streams()


if __name__ == "__main__":
    main()
