"""Samplers and logits processors for one request.

Where ours differ from mlx-lm's, and why:
- `KeyedSampler` draws every token from a key of its own, seeded or not. mlx-lm's
  samplers and filters (`make_sampler`, `apply_top_k`, ...) are compiled with MLX's
  global random state as an input and an output; an exception inside one of them (a
  `top_k` at the vocabulary's size, say) left that state without a primitive, and every
  later unseeded request failed until the engine died. No request may touch that
  state, so the filters here are our own, and a draw's key depends only on the seed and
  the draw's index: a sequence replayed after a failed batch step draws again exactly
  what it would have drawn (`rewind`).
- `GuardedProcessor` / `GuardedSampler`: mlx-lm applies every row's processors and
  samplers inside one batched step, so one request's exception would fail the whole
  batch; these record the error on the request and leave its row usable, and the worker
  then fails that request alone.
Presence/frequency penalties see only generated tokens (OpenAI semantics), not the prompt.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import greedy_sampler, make_logits_processors

from ._types import LogitsProcessor, SamplingParams

Sampler = Callable[[mx.array], mx.array]

_WHOLE_SEQUENCE = 1 << 30
_MASK64 = (1 << 64) - 1


def key_for_draw(seed: int, draw: int) -> mx.array:
    """The key of a sequence's `draw`-th token: splitmix64 of (seed, draw).

    Any integer seed works (OpenAI's are signed 64-bit): it is taken modulo 2^64.
    Keys come from the seed and the index alone, not from a chain of splits, so a
    sampler can be rewound to any draw.
    """
    z = (seed + (draw + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mx.random.key(z ^ (z >> 31))


def _top_k(logprobs: mx.array, k: int) -> mx.array:
    drop = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[..., k:]
    return mx.put_along_axis(logprobs, drop, mx.array(-float("inf"), logprobs.dtype), axis=-1)


@mx.compile
def _top_p(logprobs: mx.array, top_p: mx.array) -> mx.array:
    # mlx-lm's apply_top_p, without the global random state (and top_p an array: no retrace).
    sorted_logprobs = mx.sort(logprobs, axis=-1)
    sorted_probs = mx.exp(sorted_logprobs.astype(mx.float32))
    mass_above = mx.cumsum(sorted_probs, axis=-1, reverse=True, inclusive=False)
    total_mass = mass_above[..., :1] + sorted_probs[..., :1]
    num_dropped = (mass_above >= top_p * total_mass).sum(axis=-1, keepdims=True)
    # A top_p that underflows drops everything: keep the most likely token, as top_p -> 0 does.
    num_dropped = mx.minimum(num_dropped, logprobs.shape[-1] - 1)
    threshold = mx.take_along_axis(sorted_logprobs, num_dropped, axis=-1)
    return mx.where(logprobs < threshold, -float("inf"), logprobs)


@mx.compile
def _min_p(logprobs: mx.array, log_min_p: mx.array) -> mx.array:
    threshold = mx.max(logprobs, axis=-1, keepdims=True) + log_min_p
    return mx.where(logprobs < threshold, -float("inf"), logprobs)


@mx.compile
def _draw(logprobs: mx.array, key: mx.array, inverse_temperature: mx.array) -> mx.array:
    return mx.random.categorical(logprobs * inverse_temperature, key=key)


class KeyedSampler:
    """Top-p, min-p and top-k filtering as mlx-lm does them, then a categorical draw with
    this sequence's key for this draw. A request without a seed gets a random one."""

    def __init__(self, params: SamplingParams) -> None:
        self._seed = params.seed if params.seed is not None else secrets.randbits(64)
        self.draws = 0
        """Tokens drawn so far; `rewind` sets it."""
        self._top_p = mx.array(params.top_p) if 0.0 < params.top_p < 1.0 else None
        self._log_min_p = mx.log(mx.array(params.min_p)) if params.min_p > 0.0 else None
        self._top_k = params.top_k
        self._inverse_temperature = mx.array(1.0 / params.temperature)

    def rewind(self, draws: int) -> None:
        """Draw next as the `draws`-th token (a replayed sequence discards the token in flight)."""
        self.draws = draws

    def __call__(self, logprobs: mx.array) -> mx.array:
        key = key_for_draw(self._seed, self.draws)
        self.draws += 1
        if self._top_p is not None:
            logprobs = _top_p(logprobs, self._top_p)
        if self._log_min_p is not None:
            logprobs = _min_p(logprobs, self._log_min_p)
        if 0 < self._top_k < logprobs.shape[-1]:  # k at or past the vocabulary filters nothing
            logprobs = _top_k(logprobs, self._top_k)
        return _draw(logprobs, key, self._inverse_temperature)


class GuardedSampler:
    """Run `sampler`; on an exception, record it in `failures` and take the row's argmax, so
    that the batch's step completes. The worker then fails this request alone."""

    def __init__(self, sampler: Sampler, failures: list[BaseException]) -> None:
        self._sampler = sampler
        self._failures = failures

    def rewind(self, draws: int) -> None:
        rewind_sampler(self._sampler, draws)

    def __call__(self, logprobs: mx.array) -> mx.array:
        if not self._failures:
            try:
                token = self._sampler(logprobs)
                if not isinstance(token, mx.array) or token.shape != logprobs.shape[:-1]:
                    raise TypeError(
                        f"sampler returned {type(token).__name__} "
                        f"{getattr(token, 'shape', '')}, expected shape {logprobs.shape[:-1]}"
                    )
                return token
            except Exception as exc:  # noqa: BLE001 - isolated per request by design
                self._failures.append(exc)
        return mx.argmax(logprobs, axis=-1)


_GREEDY_BELOW = 1e-30
"""Temperatures this small are argmax: their inverse overflows float32, and logits times
infinity are no distribution."""


def make_request_sampler(params: SamplingParams, failures: list[BaseException]) -> Sampler:
    if params.temperature < _GREEDY_BELOW:
        greedy: Sampler = greedy_sampler  # shared: the batch samples greedy rows in one call
        return greedy
    return GuardedSampler(KeyedSampler(params), failures)


def rewind_sampler(sampler: Sampler, draws: int) -> None:
    """Make `sampler`'s next draw its `draws`-th (a no-op for stateless samplers)."""
    rewind = getattr(sampler, "rewind", None)
    if rewind is not None:
        rewind(draws)


class GeneratedOnly:
    """Apply `processor` to the generated tokens only (the context minus the prompt)."""

    def __init__(self, processor: LogitsProcessor, prompt_length: int) -> None:
        self._processor = processor
        self._prompt_length = prompt_length

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        generated = tokens[self._prompt_length :]
        if generated.size == 0:
            return logits
        processed: mx.array = self._processor(generated, logits)
        return processed


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
