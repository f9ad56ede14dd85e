"""What the engine thread counts as it runs sequences (read into `WorkerStats`)."""

from __future__ import annotations

from collections import Counter

import attrs


@attrs.define
class RunCounters:
    """Counts since the engine started. Written on the engine thread only; `steps` is also
    read from Trio for cancellation accounting (an int: atomic under the GIL)."""

    steps: int = 0
    solo_steps: int = 0
    """Steps run on the single-sequence fast path."""
    generated_tokens: int = 0
    retired_prefill: int = 0
    """Prompt tokens prefilled by batch steppers since replaced (after failures)."""
    failed_steps: int = 0
    failures_in_a_row: int = 0
    """Failed steps no suspect explained, since the last good step (the fatal limit's)."""
    handovers: int = 0
    isolated_failures: int = 0
    replays: int = 0
    preemptions: int = 0
    held_for_memory: int = 0
    priority_preemptions: Counter[int] = attrs.field(factory=Counter)
    """Sequences taken off the device for a request of a better class, by their priority."""
    verify_steps: int = 0
    """Speculation's verify steps (each a forward of drafted tokens)."""
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    def verified(self, sequence: object, drafted: int, accepted: int) -> None:
        """A verify step of `sequence` ran `drafted` drafts and kept `accepted` of them."""
        self.verify_steps += 1
        self.draft_tokens += drafted
        self.accepted_draft_tokens += accepted
