"""Samplers and logits processors for one request, built from mlx-lm's parts.

Two wrappers change mlx-lm's behaviour where ours must differ:
- `SeededSampler`: mlx-lm samples from MLX's global random state, so a seed
  would not reproduce under batching; this one owns its key.
- `GuardedProcessor`: mlx-lm applies every row's processors inside one batched
  step, so one request's exception would fail the whole batch; this records the
  error on the request and leaves its logits unchanged, and the worker then
  fails that request alone.
Presence/frequency penalties see only generated tokens (OpenAI semantics),
not the prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_logits_processors,
    make_sampler,
)

from ._types import LogitsProcessor, SamplingParams

Sampler = Callable[[mx.array], mx.array]

_WHOLE_SEQUENCE = 1 << 30


class SeededSampler:
    """Top-p/min-p/top-k filtering as mlx-lm does it, then a categorical draw from our own key."""

    def __init__(self, params: SamplingParams) -> None:
        self._key = mx.random.key(params.seed if params.seed is not None else 0)
        self._params = params

    def __call__(self, logprobs: mx.array) -> mx.array:
        p = self._params
        self._key, subkey = mx.random.split(self._key)
        if 0.0 < p.top_p < 1.0:
            logprobs = apply_top_p(logprobs, p.top_p)
        if p.min_p > 0.0:
            logprobs = apply_min_p(logprobs, p.min_p)
        if p.top_k > 0:
            logprobs = apply_top_k(logprobs, p.top_k)
        return mx.random.categorical(logprobs * (1.0 / p.temperature), key=subkey)


def make_request_sampler(params: SamplingParams) -> Sampler:
    if params.temperature == 0.0:
        return greedy_sampler  # shared object: the batch samples greedy rows in one call
    if params.seed is not None:
        return SeededSampler(params)
    return make_sampler(
        temp=params.temperature,
        top_p=params.top_p if params.top_p < 1.0 else 0.0,
        min_p=params.min_p,
        top_k=params.top_k,
    )


class GeneratedOnly:
    """Apply `processor` to the generated tokens only (the context minus the prompt)."""

    def __init__(self, processor: LogitsProcessor, prompt_length: int) -> None:
        self._processor = processor
        self._prompt_length = prompt_length

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        generated = tokens[self._prompt_length :]
        if generated.size == 0:
            return logits
        return self._processor(generated, logits)


class GuardedProcessor:
    """Run `processor`; on an exception, record it in `failures` and pass the logits through."""

    def __init__(self, processor: LogitsProcessor, failures: list[BaseException]) -> None:
        self._processor = processor
        self._failures = failures

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._failures:
            return logits
        try:
            result = self._processor(tokens, logits)
            if not isinstance(result, mx.array) or result.shape != logits.shape:
                raise TypeError(
                    f"logits processor returned {type(result).__name__} "
                    f"{getattr(result, 'shape', '')}, expected an array of shape {logits.shape}"
                )
            return result
        except Exception as exc:  # noqa: BLE001 - isolated per request by design
            self._failures.append(exc)
            return logits


def make_request_processors(
    params: SamplingParams,
    extra: tuple[LogitsProcessor, ...],
    prompt_length: int,
    failures: list[BaseException],
) -> list[Any]:
    processors: list[LogitsProcessor] = []
    if params.logit_bias:
        processors += make_logits_processors(logit_bias=dict(params.logit_bias))
    if params.repetition_penalty not in (None, 1.0):
        processors += make_logits_processors(repetition_penalty=params.repetition_penalty)
    penalties = make_logits_processors(
        presence_penalty=params.presence_penalty or None,
        presence_context_size=_WHOLE_SEQUENCE,
        frequency_penalty=params.frequency_penalty or None,
        frequency_context_size=_WHOLE_SEQUENCE,
    )
    processors += [GeneratedOnly(p, prompt_length) for p in penalties]
    processors += list(extra)
    return [GuardedProcessor(p, failures) for p in processors]
