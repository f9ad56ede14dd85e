"""LoRA adapters per request, batched (issue 36 item 3): 8 concurrent streams on the base
model against 8 streams spread over 4 adapters (2 each), all in one batch, on one engine in
process. Both runs use the same engine (adapters loaded, projections unfused), so the
difference is the adapters' per-row matmuls; a third run on an engine without adapters
(fused projections, the default) shows what enabling adapters costs the base.

Usage: `python -P bench/lora.py [--preset small] [--streams 8] [--adapters 4] [--tokens 64]
[--rank 8] [--rounds 2]`; prints one JSON line: decode tok/s per mode (the median over
rounds, each round after a warm-up round of the same shapes), and whether each adapter's
output differed from the base's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from mlx_nursery.engine import EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.tools import make_adapter, make_model


async def _wave(engine: Any, requests: list[GenerationRequest]) -> tuple[float, list[list[int]]]:
    """Run `requests` at once; output tokens per second over the wave, and each's tokens."""
    outputs: list[list[int]] = [[] for _ in requests]

    async def one(i: int) -> None:
        async with engine.generate(requests[i]) as stream:
            async for event in stream:
                if event.token_id is not None:
                    outputs[i].append(event.token_id)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(requests)):
            nursery.start_soon(one, i)
    elapsed = time.perf_counter() - started
    return sum(len(o) for o in outputs) / elapsed, outputs


async def _measure(config: EngineConfig, names: list[str | None], args: Any) -> dict[str, Any]:
    async with open_engine(config) as engine:
        tokenizer = engine.model.tokenizer
        requests = [
            GenerationRequest(
                tokenizer.encode(f"Stream {i} tells a story about the sea and a lighthouse."),
                max_tokens=args.tokens,
                sampling=SamplingParams(temperature=0.0),
                ignore_eos=True,
                adapter=name,
            )
            for i, name in enumerate(names)
        ]
        await _wave(engine, requests)  # warm-up: the same shapes
        rates, outputs = [], []
        for _ in range(args.rounds):
            rate, outputs = await _wave(engine, requests)
            rates.append(rate)
    return {"tok_s": statistics.median(rates), "rounds": rates, "outputs": outputs}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "model", args.preset, seed=0)
        adapters = tuple(
            (f"lora{i}", make_adapter(Path(tmp) / f"lora{i}", model, seed=i + 1, rank=args.rank))
            for i in range(args.adapters)
        )
        base = EngineConfig(model, max_concurrency=args.streams, warmup=False)
        config = EngineConfig(model, max_concurrency=args.streams, warmup=False, adapters=adapters)
        spread: list[str | None] = [adapters[i % len(adapters)][0] for i in range(args.streams)]
        plain = await _measure(base, [None] * args.streams, args)
        on_base = await _measure(config, [None] * args.streams, args)
        mixed = await _measure(config, spread, args)
    differs = [m != on_base["outputs"][0] for m in mixed["outputs"]]
    report = {
        **vars(args),
        "base_without_adapters_tok_s": plain["tok_s"],
        "base_with_adapters_enabled_tok_s": on_base["tok_s"],
        "four_adapters_tok_s": mixed["tok_s"],
        "per_round": {
            "plain": plain["rounds"],
            "base": on_base["rounds"],
            "mixed": mixed["rounds"],
        },
        "adapter_outputs_differ_from_base": all(differs),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    trio.run(main)
