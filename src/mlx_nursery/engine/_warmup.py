"""A warm-up before the engine reports ready: the kernels a first request needs, compiled
before any request waits for them.

MLX builds kernels on first use: on CUDA it compiles them at run time (NVRTC), and a fresh
process's first requests waited for that, far longer than any later one
(docs/benchmarks.md, "Cold start, and the warm-up"). The warm-up runs what serving runs,
on a dummy prompt: a prefill and decode steps alone (the fast path), then a small batch
with sampling, prefill chunks of two lengths and a sequence leaving the batch. Shapes of
real traffic differ (`_shapes`), but the kernels are built per operation and type far more
than per shape. Engine thread; the server's /health answers 503 until it is done.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import mlx.core as mx

from ._kv_quant import CacheFactory
from ._schedule import ServingBatchGenerator
from ._upstream import make_prompt_cache, make_sampler

log = logging.getLogger("mlx_nursery.engine")

PROMPT_TOKENS = 48
DECODE_STEPS = 4
MAX_CALLS = 100
"""Of the batch's `next()`: more than the warm-up needs, a bound should mlx-lm change."""


def warm_up(
    model: Any, prefill_step_size: int, make_cache: CacheFactory = make_prompt_cache
) -> float:
    """Run the warm-up on `model`, in caches as `make_cache` makes them (a quantized cache
    has kernels of its own); return the seconds it took. Raises what the model raises (the
    engine then fails to start, as a model that cannot compute should)."""
    started = time.perf_counter()
    prompt = [1 + (7 * i) % 255 for i in range(PROMPT_TOKENS)]  # ids every vocabulary has
    cache = make_cache(model)
    logits = model(mx.array([prompt]), cache=cache)
    for _ in range(DECODE_STEPS):
        token = mx.argmax(logits[:, -1, :], axis=-1)
        logits = model(token[:, None], cache=cache)
    mx.eval(logits)
    del cache, logits

    generator = ServingBatchGenerator(
        model,
        completion_batch_size=2,
        prefill_batch_size=2,
        prefill_step_size=min(prefill_step_size, PROMPT_TOKENS // 2),
    )
    try:
        uids = generator.insert(
            [prompt, prompt[: PROMPT_TOKENS // 3]],
            max_tokens=[DECODE_STEPS, 2 * DECODE_STEPS],
            caches=[make_cache(model), make_cache(model)],
            samplers=[make_sampler(temp=0.7), make_sampler(temp=0.7, top_p=0.9)],
        )
        running = set(uids)
        for _ in range(MAX_CALLS):
            for response in generator.next()[1]:
                if response.finish_reason is not None:
                    running.discard(response.uid)
            if not running:
                break
    finally:
        generator.close()
    mx.synchronize()
    mx.clear_cache()
    return time.perf_counter() - started
