"""Where a warm ~8,000-token shared prompt's time to first token goes, in one process on
the 8B-shaped model: the engine's own TTFT (no HTTP, no tokenizing) for a prompt whose
first 8,010 tokens were served before and whose 43-token tail is new, and for the same
prompt sent again (all but its last token cached); then the bare work such a request
needs: the cached KV copied (as the prefix cache's fetch copies it), the tail's forward,
the first token read. A probe for issue 32's warm shared-prompt target, not a benchmark.

Usage: python3 -P warm_prefix.py /tmp/l8b
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
import trio

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.models import release_mlx_streams

GREEDY = SamplingParams(temperature=0.0)
VOCAB = 2048  # set from the model's config in main


async def ttft(engine: Engine, tokens: list[int]) -> float:
    request = GenerationRequest(tokens, max_tokens=8, sampling=GREEDY, ignore_eos=True)
    started = time.perf_counter()
    first = None
    async with engine.generate(request) as stream:
        async for _ in stream:
            if first is None:
                first = time.perf_counter() - started
    assert first is not None
    return first


async def engine_side(path: Path, prefix: list[int], rng: random.Random) -> None:
    config = EngineConfig(path, max_concurrency=32)
    async with open_engine(config) as engine:
        await ttft(engine, [*prefix, 5, 6, 7])  # cold: fills the prefix cache
        tails, again = [], []
        for _ in range(12):
            prompt = prefix + [rng.randrange(10, VOCAB) for _ in range(43)]
            tails.append(await ttft(engine, prompt))
            again.append(await ttft(engine, prompt))
        print(
            f"engine TTFT, new 43-token tail: median {1000 * statistics.median(tails):.1f} ms"
            f" {[round(1000 * t, 1) for t in tails]}"
        )
        print(
            f"engine TTFT, same prompt again: median {1000 * statistics.median(again):.1f} ms"
            f" {[round(1000 * t, 1) for t in again]}"
        )


def bare(path: Path, prefix: list[int], rng: random.Random) -> None:
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(str(path))
    cache = make_prompt_cache(model)
    for i in range(0, len(prefix), 512):
        model(mx.array([prefix[i : i + 512]]), cache=cache)
        mx.eval([c.state for c in cache])
    rows = []
    for _ in range(12):
        tail = [rng.randrange(10, VOCAB) for _ in range(43)]
        t0 = time.perf_counter()
        copied = copy.deepcopy(cache)
        mx.eval([c.state for c in copied])
        t1 = time.perf_counter()
        logits = model(mx.array([tail]), cache=copied)
        token = mx.argmax(logits[:, -1], axis=-1)
        t2 = time.perf_counter()
        token.item()
        t3 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2))
        del copied
    for name, i in (("copy", 0), ("build", 1), ("launch+run+read", 2)):
        print(f"bare {name}: median {1000 * statistics.median(r[i] for r in rows):.2f} ms")


def main() -> None:
    global VOCAB
    path = Path(sys.argv[1])
    VOCAB = json.loads((path / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    prefix = [rng.randrange(10, VOCAB) for _ in range(8010)]
    try:
        trio.run(engine_side, path, prefix, rng)
        bare(path, prefix, rng)
    finally:
        release_mlx_streams()


if __name__ == "__main__":
    main()
