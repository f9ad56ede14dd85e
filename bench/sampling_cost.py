"""What per-request samplers and logits processors cost a batch's decode step.

mlx-lm's `BatchGenerator` samples all rows in one call only when every row shares one
sampler object, and runs logits processors row by row. Every request here has a sampler
of its own (a keyed one, for reproducible draws), and `logit_bias` or penalties add a
processor. This times decode steps of a full batch (`--batch` rows of `--prompt-tokens`)
under each way, on the same model, in one process.

Usage: `python -P bench/sampling_cost.py --model DIR [--batch 32] [--steps 40]`; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from mlx_nursery.engine import SamplingParams
from mlx_nursery.engine._processors import make_request_processors
from mlx_nursery.engine._sampling import make_request_sampler
from mlx_nursery.engine._stepper import _RowSamplers


def time_steps(model: Any, batch: int, prompt: int, steps: int, way: str) -> float:
    vocab = model.args.vocab_size
    shared = make_sampler(temp=0.7)
    params = SamplingParams(temperature=0.7)
    samplers: list[Any] = []
    processors: list[list[Any]] = []
    for _ in range(batch):
        if way == "shared sampler":
            samplers.append(shared)
            processors.append([])
        elif way == "per-request samplers":
            samplers.append(make_request_sampler(params, []))
            processors.append([])
        elif way == "per-request samplers + logit_bias":
            samplers.append(make_request_sampler(params, []))
            processors.append(make_logits_processors(logit_bias={0: -100.0}))
        elif way == "shared sampler + logit_bias":
            samplers.append(shared)
            processors.append(make_logits_processors(logit_bias={0: -100.0}))
        elif way == "ours: per-request samplers, batched":
            samplers.append(make_request_sampler(params, []))
            processors.append([])
        elif way == "ours, logit_bias guarded":
            samplers.append(make_request_sampler(params, []))
            bias = SamplingParams(temperature=0.7, logit_bias={0: -100.0})
            processors.append(make_request_processors(bias, (), prompt, []))
    generator = BatchGenerator(model, completion_batch_size=batch, prefill_batch_size=8)
    prompts = [[(row * 7919 + i) % vocab for i in range(prompt)] for row in range(batch)]
    batched = way.startswith("ours: ")
    rows = _RowSamplers()
    uids = generator.insert(
        prompts,
        max_tokens=[100_000] * batch,
        samplers=[rows] * batch if batched else samplers,
        logits_processors=processors,
    )
    rows.by_uid.update(zip(uids, samplers, strict=True))
    while len(generator._generation_batch) < batch:  # prefill everyone first
        generator.next()
    for _ in range(5):
        generator.next()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        generator.next()
        times.append(time.perf_counter() - start)
    generator.close()
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    model, _ = load(args.model)
    ways = [
        "shared sampler",
        "per-request samplers",
        "ours: per-request samplers, batched",
        "shared sampler + logit_bias",
        "per-request samplers + logit_bias",
        "ours, logit_bias guarded",
    ]
    result = {
        way: time_steps(model, args.batch, args.prompt_tokens, args.steps, way) for way in ways
    }
    print(json.dumps({"device": str(mx.default_device()), **vars(args), "step_ms": result}))


if __name__ == "__main__":
    main()
