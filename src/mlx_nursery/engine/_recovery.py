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
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from ._sequence import LiveSequence

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
