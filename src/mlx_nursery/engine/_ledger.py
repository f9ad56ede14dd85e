"""Where each sequence is on the engine thread, and the one way a sequence ends.

A submitted sequence is in exactly one place: queued (in the command queue, or `held`
while a failed step's sequences are on probation or the KV budget cannot take it yet),
`active` (under its uid, held by the worker's current stepper), on `probation` (after a
failed step: held by no stepper until replayed), `preempted` (taken out of the batch to
stay within the KV budget: held by no stepper until replayed), `imaging` (its prompt,
which holds images, being prefilled a chunk per iteration: held by no stepper until done),
`detaching` (ended, still in its stepper until the next settle) or gone (confirmed). It
ends once, through `end`: its final event and the confirmation that it computes nothing
more go to the outbox together.
"""

from __future__ import annotations

from ._messages import StepEvent, Submit
from ._outbox import Outbox
from ._sequence import LiveSequence, unstarted_end
from ._stepper import KVState, Stepper
from ._types import FinishReason


class InvariantViolation(RuntimeError):
    """The engine thread's bookkeeping broke one of its rules: a bug; the engine stops."""


class Ledger:
    def __init__(self, outbox: Outbox, *, checking: bool) -> None:
        self._outbox = outbox
        self._checking = checking
        self.active: dict[int, LiveSequence] = {}
        """By uid in the current stepper."""
        self.uids: dict[int, int] = {}
        """seq_id -> uid of the active sequences."""
        self.probation: dict[int, LiveSequence] = {}
        """By seq_id: sequences of a failed step, waiting to be replayed one at a time."""
        self.imaging: dict[int, LiveSequence] = {}
        """By seq_id, oldest first: image prompts being prefilled (`LiveSequence.prefill`)."""
        self.preempted: dict[int, LiveSequence] = {}
        """By seq_id, oldest first: taken out of the batch for memory, replayed when they fit."""
        self.held: list[Submit] = []
        """Submissions waiting, in order: during probation (so that new arrivals, each a
        newcomer for all its prefill, cannot keep a suspect from its replay), or until the
        KV budget takes them (after the preempted)."""
        self.detaching: list[tuple[LiveSequence, Stepper]] = []
        self.to_store: list[tuple[LiveSequence, KVState]] = []
        """Ended sequences' KV state, for the prefix cache once their final events are out."""
        self._gone: set[int] = set()  # only while checking

    @property
    def running(self) -> int:
        """Sequences admitted and not ended, or waiting to be."""
        waiting = len(self.probation) + len(self.preempted) + len(self.imaging) + len(self.held)
        return len(self.active) + waiting

    def track(self, sequence: LiveSequence, uid: int) -> None:
        """`sequence` is active under `uid` (a newcomer until its first token)."""
        sequence.newcomer = True
        sequence.uid = uid
        self.active[uid] = sequence
        self.uids[sequence.seq_id] = uid

    def forget(self, sequence: LiveSequence) -> None:
        """`sequence` is no longer active (no-op if it was not)."""
        if self.active.get(sequence.uid) is sequence:  # a replayed one's old uid may be reused
            del self.active[sequence.uid]
        if self.uids.get(sequence.seq_id) == sequence.uid:
            del self.uids[sequence.seq_id]

    def end(self, seq_id: int, event: StepEvent) -> None:
        """The one way a sequence ends: its final event and its confirmation, once."""
        if self._checking:
            if seq_id in self._gone:
                raise InvariantViolation(f"sequence {seq_id} ended twice")
            self._gone.add(seq_id)
        self._outbox.end(seq_id, event)

    def finish(self, sequence: LiveSequence, event: StepEvent) -> None:
        """End a sequence held by no stepper (any more)."""
        self.end(sequence.seq_id, event)
        self.forget(sequence)

    def end_unstarted(
        self, command: Submit, reason: FinishReason, error: str | None = None
    ) -> None:
        self.end(command.seq_id, unstarted_end(command, reason, error))

    def remove(
        self, uid: int, stepper: Stepper, reason: FinishReason, error: str | None = None
    ) -> None:
        """End an active sequence now: no step runs for it after this. Its confirmation is
        posted by the next settle, which then detaches it from `stepper`."""
        sequence = self.active[uid]
        self.detaching.append((sequence, stepper))
        self.finish(sequence, sequence.final(reason, error))

    def check(self, stepper: Stepper, idle: Stepper) -> None:
        """Assert the rules after a settled iteration (`Worker`'s docstring)."""
        problems = []
        if self.detaching or self.to_store or self._outbox.confirming:
            problems.append("an ended sequence was not posted, detached and stored")
        if any(s.uid != uid or self.uids.get(s.seq_id) != uid for uid, s in self.active.items()):
            problems.append("the active sequences and their uids disagree")
        if len(self.uids) != len(self.active):
            problems.append("a seq id maps to no active sequence")
        if set(self.active) != stepper.uids:
            problems.append("the current stepper does not hold exactly the active sequences")
        if idle.uids:
            problems.append("the stepper not in use holds sequences")
        ids = [
            *(s.seq_id for s in self.active.values()),
            *self.probation,
            *self.preempted,
            *self.imaging,
            *(c.seq_id for c in self.held),
        ]
        if len(ids) != len(set(ids)) or self._gone.intersection(ids):
            problems.append("a sequence is in two places, or back after its end")
        if problems:
            raise InvariantViolation("; ".join(problems))
