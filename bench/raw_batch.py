"""The raw reference for serving throughput: mlx-lm's `batch_generate` on one wave of equal
prompts, no server around it (issue 18's "raw batch_generate of 32 equal prompts").

Usage: `python -P bench/raw_batch.py --model DIR --prompts 32 --prompt-tokens 250
--tokens 256 [--temperature 0.7] [--repeats 2]`; prints JSON: output tok/s per repeat (the
first repeat after one warm-up wave of the same shapes) and the median.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import mlx.core as mx
from mlx_lm import batch_generate, load
from mlx_lm.sample_utils import make_sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=250)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--completion-batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    vocab = model.args.vocab_size
    rng = random.Random(0)

    def wave() -> float:
        prompts = [
            [rng.randrange(100, vocab) for _ in range(args.prompt_tokens)]
            for _ in range(args.prompts)
        ]
        sampler = make_sampler(temp=args.temperature)
        mx.synchronize()
        start = time.perf_counter()
        response = batch_generate(
            model,
            tokenizer,
            prompts,
            max_tokens=args.tokens,
            sampler=sampler,
            completion_batch_size=args.completion_batch_size,
            prefill_batch_size=min(8, args.completion_batch_size),
            return_token_ids=True,
        )
        elapsed = time.perf_counter() - start
        produced = sum(len(ids) for ids in response.token_ids)
        return produced / elapsed

    wave()  # warm-up: the same shapes as the measured waves
    rates = [wave() for _ in range(args.repeats)]
    print(json.dumps({**vars(args), "tok_s": rates, "median_tok_s": statistics.median(rates)}))


if __name__ == "__main__":
    main()
