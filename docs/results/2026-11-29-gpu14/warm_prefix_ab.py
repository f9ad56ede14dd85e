"""The warm ~8,000-token shared prompt's time to first token in one process, with a prompt's
tail attended by `_sequence_attention` (the engine as built) and by MLX's composed fallback
(the router's `takes` patched to refuse), alternating request by request on one engine: an
8,010-token prefix served before, a new 43-token tail each request. A probe for issue 32's
warm shared-prompt target (gpu13's `warm_prefix.py` found the tail's attention its largest
part), not a benchmark.

Usage: python3 -P warm_prefix_ab.py /tmp/l8b [PREFIX_TOKENS] [ROUNDS]
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

import trio

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.engine import _decode_attention
from mlx_nursery.models import release_mlx_streams

GREEDY = SamplingParams(temperature=0.0)
ROUTED = _decode_attention.takes


async def ttft(engine: Engine, tokens: list[int]) -> float:
    request = GenerationRequest(tokens, max_tokens=4, sampling=GREEDY, ignore_eos=True)
    started = time.perf_counter()
    first = None
    async with engine.generate(request) as stream:
        async for _ in stream:
            if first is None:
                first = time.perf_counter() - started
    assert first is not None
    return first


async def main_async(path: Path, vocab: int, prefix_len: int, rounds: int) -> None:
    rng = random.Random(0)
    prefix = [rng.randrange(10, vocab) for _ in range(prefix_len)]
    async with open_engine(EngineConfig(path, max_concurrency=32)) as engine:
        await ttft(engine, [*prefix, 5, 6, 7])  # cold: fills the prefix cache
        times: dict[str, list[float]] = {"sequence_attention": [], "mlx_composed": []}
        for i in range(rounds):
            for name in list(times) if i % 2 == 0 else list(times)[::-1]:
                _decode_attention.takes = ROUTED if name == "sequence_attention" else (
                    lambda *a, **k: False
                )
                t = await ttft(engine, prefix + [rng.randrange(10, vocab) for _ in range(43)])
                if i >= 2:  # the first of each built its kernels
                    times[name].append(t)
        _decode_attention.takes = ROUTED
        for name, samples in times.items():
            print(
                f"engine TTFT, new 43-token tail, {name}: median "
                f"{1000 * statistics.median(samples):.1f} ms, p90 "
                f"{1000 * sorted(samples)[int(0.9 * len(samples))]:.1f}"
                f" {[round(1000 * t, 1) for t in samples]}",
                flush=True,
            )


def main() -> None:
    path = Path(sys.argv[1])
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prefix_len = int(sys.argv[2]) if len(sys.argv) > 2 else 8010
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 28
    try:
        trio.run(main_async, path, vocab, prefix_len, rounds)
    finally:
        release_mlx_streams()


if __name__ == "__main__":
    main()
