"""LoRA adapters per request, batched (issue 36 item 3): 8 concurrent streams on the base
model against 8 streams spread over 4 adapters (2 each), all in one batch, on one engine in
process. The base's streams and the adapters' run on one engine (adapters loaded), so their
difference is the adapters' per-row matmuls; a third run on an engine without adapters shows
what enabling adapters costs the base. The three alternate round by round (`_interleaved`).

Usage: `python -P bench/lora.py [--preset small | --model DIR] [--streams 8] [--adapters 4]
[--tokens 64] [--rank 8] [--layers 2] [--rounds 2]`; prints one JSON line: decode tok/s per
mode (the median over rounds, after a warm-up wave of the same shapes), whether each adapter
stream's output differed from the same stream's on the base, and whether the base's outputs
are the same with adapters enabled as without.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
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


def _requests(engine: Any, names: list[str | None], tokens: int) -> list[GenerationRequest]:
    tokenizer = engine.model.tokenizer
    return [
        GenerationRequest(
            tokenizer.encode(f"Stream {i} tells a story about the sea and a lighthouse."),
            max_tokens=tokens,
            sampling=SamplingParams(temperature=0.0),
            ignore_eos=True,
            adapter=name,
        )
        for i, name in enumerate(names)
    ]


async def _interleaved(
    runs: dict[str, tuple[EngineConfig, list[str | None]]], args: Any
) -> dict[str, Any]:
    """Each run's engine open at once (idle while another runs); one warm-up wave each, then
    `args.rounds` rounds of one wave per run, in turn, so that drift in a shared machine's
    load spreads over all of them."""
    async with AsyncExitStack() as stack:
        engines = {
            name: await stack.enter_async_context(open_engine(c)) for name, (c, _) in runs.items()
        }
        requests = {name: _requests(engines[name], runs[name][1], args.tokens) for name in runs}
        for name in runs:
            await _wave(engines[name], requests[name])
        rates: dict[str, list[float]] = {name: [] for name in runs}
        outputs: dict[str, list[list[int]]] = {}
        for _ in range(args.rounds):
            for name in runs:
                rate, outputs[name] = await _wave(engines[name], requests[name])
                rates[name].append(rate)
    return {"rates": rates, "outputs": outputs}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model", help="an existing model directory (default: make --preset)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2, help="the last N blocks adapted")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = (
            Path(args.model) if args.model else make_model(Path(tmp) / "model", args.preset, seed=0)
        )
        adapters = tuple(
            (
                f"lora{i}",
                make_adapter(
                    Path(tmp) / f"lora{i}", model, seed=i + 1, rank=args.rank, layers=args.layers
                ),
            )
            for i in range(args.adapters)
        )
        base = EngineConfig(model, max_concurrency=args.streams, warmup=False)
        config = EngineConfig(model, max_concurrency=args.streams, warmup=False, adapters=adapters)
        spread: list[str | None] = [adapters[i % len(adapters)][0] for i in range(args.streams)]
        result = await _interleaved(
            {
                "plain": (base, [None] * args.streams),
                "base": (config, [None] * args.streams),
                "mixed": (config, spread),
            },
            args,
        )
    rates, outputs = result["rates"], result["outputs"]
    report = {
        **vars(args),
        "base_without_adapters_tok_s": statistics.median(rates["plain"]),
        "base_with_adapters_enabled_tok_s": statistics.median(rates["base"]),
        "four_adapters_tok_s": statistics.median(rates["mixed"]),
        "per_round": rates,
        "adapter_outputs_differ_from_base": all(
            mine != theirs for mine, theirs in zip(outputs["mixed"], outputs["base"], strict=True)
        ),
        "base_outputs_equal_with_adapters_enabled": outputs["plain"] == outputs["base"],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    trio.run(main)
