"""A request's logits processors (logit bias when logprobs are asked, repetition, presence
and frequency penalties, and the request's own), each guarded so that one request's failure
inside a batched step fails that request alone (the worker acts on it after the step).
Presence/frequency penalties see only generated tokens (OpenAI semantics), not the prompt.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from ._types import LogitsProcessor, SamplingParams
from ._upstream import make_logits_processors

_WHOLE_SEQUENCE = 1 << 30


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
    *,
    bias_as_processor: bool = True,
) -> list[Any]:
    processors: list[LogitsProcessor] = []
    if params.logit_bias and bias_as_processor:
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
