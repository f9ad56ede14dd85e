"""One sequence as the engine thread keeps it, and the per-request work done for it.

Everything here runs on the engine thread. Building a sequence (its sampler, its logits
processors) is per-request work: the worker calls it inside that request's guard, so a
failure fails that request alone.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import mlx.core as mx

from .. import fault_points
from ._messages import StepEvent, Submit
from ._processors import GuardedProcessor, make_request_processors
from ._sampling import GuardedSampler, Sampler, make_request_sampler, rewind_sampler
from ._types import FinishReason, GenerationRequest, TokenLogprob, Usage

COULD_NOT_START = "the engine could not start this request"
COULD_NOT_CONTINUE = "the engine could not continue this request"
FAILED_WHILE_SERVING = "the engine failed while serving this request"
"""The errors of final events that end a request the engine failed on alone, or with others."""


class Response(Protocol):
    """One sequence's token from a stepper: BatchGenerator's responses and the fast path's
    are both shaped so."""

    @property
    def uid(self) -> int: ...
    @property
    def token(self) -> Any: ...
    @property
    def logprobs(self) -> mx.array: ...
    @property
    def finish_reason(self) -> Any: ...
    @property
    def prompt_cache(self) -> list[Any] | None: ...
    @property
    def all_tokens(self) -> list[int] | None: ...


@attrs.define(eq=False)
class LiveSequence:
    """A sequence from its admission to its end."""

    seq_id: int
    request: GenerationRequest
    sampler: Any
    processors: list[Any]
    stop_ids: frozenset[int]
    failures: list[BaseException]
    """What its sampler and logits processors raised (they run inside a step: recorded there,
    acted on after it)."""
    uid: int = -1
    """Its id in the stepper that holds it (fast-path ids are negative, batch ids are not)."""
    cached_tokens: int = 0
    generated: int = 0
    tokens: list[int] = attrs.Factory(list)
    """Every token posted so far: with the prompt, what a replay prefills."""
    newcomer: bool = True
    """Inserted since its last token: a suspect if a step fails now (see `_recovery`)."""
    strikes: int = 0
    """Failed steps in which it was the one suspect."""
    yielded: int = 0
    """Times it was taken off the device for a request of a better class (`_yielding`)."""
    label: str | None = None
    """The request's label (`Submit.label`), for the fault seam."""
    prefill: Any = None
    """Its image prefill while one runs (`_vision.ImagePrefill`), before any stepper holds it."""
    loading: Any = None
    """Its cached prefix's read from disk while one runs (`_loading.PrefixLoad`), before any
    stepper holds it."""
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    """Tokens drafted for it by speculation, and those of them it kept (`_speculating`)."""

    def usage(self) -> Usage:
        return Usage(
            len(self.request.prompt_tokens),
            self.generated,
            self.cached_tokens,
            self.drafted_tokens,
            self.accepted_tokens,
        )

    def final(self, reason: FinishReason, error: str | None = None) -> StepEvent:
        return StepEvent(None, None, reason, self.usage(), error)


def build_sequence(command: Submit, eos: frozenset[int]) -> LiveSequence:
    """A submitted request's sequence: its sampler, processors and stop tokens (raises what
    building them raises: the caller fails that request alone)."""
    request = command.request
    failures: list[BaseException] = []
    # The sampler applies a logit bias batch-wide; a request told its logprobs keeps it as a
    # processor, so that they are the biased ones (`_sampling`'s docstring).
    bias_in_sampler = request.logprobs is None
    sequence = LiveSequence(
        seq_id=command.seq_id,
        request=request,
        sampler=make_request_sampler(request.sampling, failures, with_bias=bias_in_sampler),
        processors=make_request_processors(
            request.sampling,
            request.logits_processors,
            len(request.prompt_tokens),
            failures,
            bias_as_processor=not bias_in_sampler,
        ),
        stop_ids=(frozenset() if request.ignore_eos else eos) | request.stop_token_ids,
        failures=failures,
        label=command.label,
    )
    if fault_points.ARMED and command.label is not None:  # a test's faults, inside the guards
        sampler = sequence.sampler
        inner = sampler.sampler if isinstance(sampler, GuardedSampler) else sampler
        sequence.sampler = GuardedSampler(FaultingSampler(inner, command.label), failures)
        sequence.processors.append(GuardedProcessor(FaultingProcessor(command.label), failures))
    return sequence


def unstarted_end(command: Submit, reason: FinishReason, error: str | None = None) -> StepEvent:
    """The final event of a request that never started (cancelled while queued, refused)."""
    return StepEvent(None, None, reason, Usage(len(command.request.prompt_tokens), 0, 0), error)


def token_logprob(sequence: LiveSequence, response: Response) -> TokenLogprob:
    """The sampled token's log-probability and the request's top alternatives."""
    logprobs = response.logprobs
    k = min(sequence.request.logprobs or 0, logprobs.shape[-1])
    top: tuple[tuple[int, float], ...] = ()
    if k:
        ids = mx.argpartition(-logprobs, kth=k - 1)[:k]
        id_list: list[int] = ids.tolist()  # type: ignore[assignment]
        value_list: list[float] = logprobs[ids].tolist()  # type: ignore[assignment]
        pairs = sorted(zip(id_list, value_list, strict=True), key=lambda p: -p[1])
        top = tuple((int(i), float(val)) for i, val in pairs)
    chosen: float = logprobs[response.token].item()  # type: ignore[assignment]
    return TokenLogprob(int(response.token), float(chosen), top)


class FaultingSampler:
    """`sampler`, with the fault seam's `sampler` point before each draw (tests only)."""

    def __init__(self, sampler: Sampler, label: str) -> None:
        self._sampler = sampler
        self._label = label

    def rewind(self, draws: int) -> None:
        rewind_sampler(self._sampler, draws)

    def __call__(self, logprobs: mx.array) -> mx.array:
        fault_points.reach("sampler", self._label)
        return self._sampler(logprobs)


class FaultingProcessor:
    """A logits processor that changes nothing: the seam's `logits_processor` point."""

    def __init__(self, label: str) -> None:
        self._label = label

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        fault_points.reach("logits_processor", self._label)
        return logits
