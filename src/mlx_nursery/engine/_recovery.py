"""After a failed step: which sequence to blame, which to replay at once, which to hold.

A batch step that raises where no per-request guard sees cannot say whose input caused
it, and the batch's state cannot be trusted afterwards. The worker replaces its batch and
replays the sequences: each one's prompt and posted tokens are prefilled again and its
sampler is rewound, so it goes on with the tokens it would have had. This module decides
who is replayed how; the worker carries the verdict out.

The suspects are the sequences inserted since their last token (newcomers: a sequence that
has stepped before has been computed with this model already), or the lone sequence of the
fast path. Suspects wait on probation while the others are replayed at once, then are
replayed one at a time, each the one newcomer in its batch; with no suspect at all, all
wait. A sequence that is the one suspect of `STRIKES_TO_BLAME` failures is blamed: the
worker fails it alone if the model still computes without it, else the failure is the
engine's. Failures that no suspect explains count toward the engine's fatal limit.

`judge` decides; `Recovery` carries the verdict out on the engine thread, and replays
(after a failure, and the preempted once they fit again).
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import mlx.core as mx

from ..models import LoadedModel
from ._config import EngineConfig
from ._counters import RunCounters
from ._imaging import Imaging
from ._ledger import Ledger
from ._placement import Placement
from ._reuse import PrefixReuse
from ._sampling import rewind_sampler
from ._sequence import COULD_NOT_CONTINUE, FAILED_WHILE_SERVING, LiveSequence
from ._stepper import Start
from ._upstream import generation_stream, make_prompt_cache

log = logging.getLogger("mlx_nursery.engine")

STRIKES_TO_BLAME = 2
"""Failed steps a sequence must be the one suspect of before it is failed alone."""


@attrs.frozen
class Verdict:
    blamed: LiveSequence | None
    """To fail alone (if the model still computes), out of probation."""
    replay_now: list[LiveSequence]
    """Not suspected: replayed at once."""
    probation: list[LiveSequence]
    """To replay one at a time once no newcomer is in the batch."""
    unexplained: bool
    """No suspect explains the failure: it counts toward the fatal limit."""


def judge(failed_batch: list[LiveSequence], *, solo: bool) -> Verdict:
    """Decide what becomes of the sequences of a failed step (counting the lone suspect's
    strike)."""
    suspects = failed_batch if solo else [s for s in failed_batch if s.newcomer]
    if not suspects:
        return Verdict(None, [], list(failed_batch), unexplained=True)
    others = [s for s in failed_batch if s not in suspects]
    blamed = None
    if len(suspects) == 1:
        suspects[0].strikes += 1
        if suspects[0].strikes >= STRIKES_TO_BLAME:
            blamed, suspects = suspects[0], []
    return Verdict(blamed, others, suspects, unexplained=False)


def model_computes(model: Any) -> bool:
    """Whether `model` still runs a one-token forward on a fresh cache (after a failed step
    with a blamed suspect: if it does not, the failure was not the suspect's)."""
    try:
        with mx.stream(generation_stream):
            mx.eval(model(mx.array([[0]], dtype=mx.uint32), cache=make_prompt_cache(model)))
    except Exception:  # the answer is "no"
        log.exception("the model fails on its own")
        return False
    return True


class FatalEngineError(RuntimeError):
    """The engine cannot continue (repeated batch failures, or a bug in the loop)."""


class Recovery:
    """Failed steps and replays, on the engine thread."""

    def __init__(
        self,
        config: EngineConfig,
        model: LoadedModel,
        ledger: Ledger,
        placement: Placement,
        imaging: Imaging,
        counters: RunCounters,
        reuse: PrefixReuse,
    ) -> None:
        self._config = config
        self._reuse = reuse
        self._model = model
        self._ledger = ledger
        self._placement = placement
        self._imaging = imaging
        self._counters = counters

    def recover(self, exc: Exception) -> None:
        """A step (or a detach) raised: replace the batch, replay its sequences, and fail
        alone the one that `judge` blames, if the model still computes without it."""
        self._counters.failed_steps += 1
        failed = self._ledger.active()
        verdict = judge(failed, solo=self._placement.current.kind == "solo")
        log.error("a step failed with %d sequences: %r", len(failed), exc)
        self._placement.replace_batch()
        for sequence in failed:  # all on probation first: whatever happens next, each is tracked
            self._ledger.to_probation(sequence)
        blamed = verdict.blamed
        if blamed is not None:
            if self._model.kind == "scripted" or model_computes(self._model.model):
                self._counters.isolated_failures += 1
                error = "the engine could not compute this request"
                self._ledger.finish(blamed, blamed.final("error", error))
            else:
                self._ledger.finish(blamed, blamed.final("error", FAILED_WHILE_SERVING))
                self._count_unexplained(exc)
        if verdict.unexplained:
            self._count_unexplained(exc)
        for sequence in verdict.replay_now:
            self.replay(sequence)

    def _count_unexplained(self, exc: Exception) -> None:
        self._counters.failures_in_a_row += 1
        if self._counters.failures_in_a_row >= self._config.max_consecutive_step_failures:
            raise FatalEngineError("batch steps keep failing") from exc

    def replay_next_suspect(self) -> None:
        """Replay the next sequence on probation once no newcomer is in the batch."""
        suspect = self._ledger.next_suspect()
        if suspect is None:
            return
        self._placement.hand_over()
        self.replay(suspect)

    def replay(self, sequence: LiveSequence, *, after_failure: bool = True) -> None:
        """Insert `sequence` into the batch afresh: its prompt and posted tokens are prefilled
        again (a preempted one's read back from the prefix cache as far as it holds them: its
        KV went there when it left, `_yielding`); its sampler's next draw is its next
        token's. After a failure nothing is read from the cache: the failed batch's states
        are suspect."""
        self._counters.replays += after_failure
        rewind_sampler(sequence.sampler, len(sequence.tokens))
        prompt = [*sequence.request.prompt_tokens, *sequence.tokens]
        remaining = sequence.request.max_tokens - sequence.generated
        images = sequence.request.images
        try:
            if not after_failure and self._replay_cached(sequence, prompt, remaining):
                return
            if images is not None:  # its images go through the vision tower again
                self._imaging.begin(sequence, prompt, images)
            else:
                start = Start(prompt, None, [], remaining)
                self._placement.insert(self._placement.batch, sequence, start)
        except Exception:  # fails this request only
            log.exception("could not replay sequence %d", sequence.seq_id)
            self._ledger.finish(sequence, sequence.final("error", COULD_NOT_CONTINUE))

    def _replay_cached(self, sequence: LiveSequence, prompt: list[int], remaining: int) -> bool:
        """Insert `sequence` into the batch at the longest cached prefix of `prompt` (its own
        tokens' KV, kept when it was taken off); False if none, or it will not merge."""
        hit = self._reuse.fetch(sequence, prompt)
        if hit is None:
            return False
        cached = hit.cached_tokens
        start = Start(prompt[cached:], hit.cache, prompt[:cached], remaining)
        try:
            self._placement.insert(self._placement.batch, sequence, start)
        except Exception:  # noqa: BLE001 - a cached state that will not merge: prefill afresh
            self._reuse.record_failure()
            return False
        return True
