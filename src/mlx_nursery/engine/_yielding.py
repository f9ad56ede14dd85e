"""Sequences taken off the device for requests of a better priority, and brought back.

It reuses the KV budget's preemption (`_admission`): a preempted sequence is replayed later
from its prompt and the tokens it posted, its sampler rewound, so the same tokens follow;
what it had computed goes to the prefix cache when it leaves, and its replay reads it back
from there (`Recovery.replay`) as far as the cache has kept it, recomputing only the rest.

- For a lane: the Trio side's lanes (`FairLanes`) ask for a sequence (`Suspend`) when a
  request of a better class waits and none is free. The sequence leaves its stepper and is
  `SUSPENDED`; the outbox tells Trio, which gives its lane to the waiter and lines it up for
  one again. When it has a lane (`Resume`) it is preempted: replayed once its KV fits, by
  priority among the others that wait.
- For KV memory: a submission or a replay that does not fit takes active sequences of a
  worse priority out of the batch (preempted, their lanes kept) if that makes it fit
  (`Admission`).

A sequence yields at most `max_preemptions` times, either way: once admitted more often than
that it runs to its end. Engine thread only.
"""

from __future__ import annotations

import logging

from ._counters import RunCounters
from ._ledger import Ledger, SeqState
from ._messages import Command, Resume, Suspend
from ._outbox import Outbox
from ._placement import Placement
from ._recovery import Recovery
from ._reuse import PrefixReuse
from ._sequence import LiveSequence

log = logging.getLogger("mlx_nursery.engine")

_SUSPENDABLE = (SeqState.ACTIVE, SeqState.PREEMPTED, SeqState.IMAGING)
"""Where a sequence may be suspended from: it runs, or waits with its lane to run."""


class Yielding:
    """Takes sequences off the device for better ones, counting each one's yields."""

    def __init__(
        self,
        ledger: Ledger,
        placement: Placement,
        reuse: PrefixReuse,
        recovery: Recovery,
        counters: RunCounters,
        outbox: Outbox,
        max_preemptions: int,
    ) -> None:
        self._ledger = ledger
        self._placement = placement
        self._reuse = reuse
        self._recovery = recovery
        self._counters = counters
        self._outbox = outbox
        self.limit = max_preemptions

    def apply(self, commands: list[Command]) -> None:
        """The suspensions and resumptions among `commands`, in order (a suspension of a
        sequence cancelled in the same batch finds it ended: kept)."""
        for command in commands:
            if isinstance(command, Suspend):
                self.suspend(command.seq_id)
            elif isinstance(command, Resume):
                self.resume(command.seq_id)

    def suspend(self, seq_id: int) -> None:
        """Answer a `Suspend`: a sequence that runs (or waits, lane held, to run) and may
        still yield is taken off the device and gives up its lane (`suspended`); any other
        keeps going (`kept`: it ended, waits unstarted, or is on probation)."""
        ledger = self._ledger
        state = ledger.state_of(seq_id)
        sequence = ledger.sequence(seq_id) if state in _SUSPENDABLE else None
        if sequence is None or sequence.yielded >= self.limit:
            self._outbox.kept(seq_id)
            return
        if state is SeqState.ACTIVE and not self.take_out(sequence):
            self._outbox.kept(seq_id)
            return
        self.count(sequence)
        ledger.suspend(sequence)  # an image prefill's partial KV goes with it
        self._outbox.suspended(seq_id)
        log.info("sequence %d suspended for a request of a better priority", seq_id)

    def resume(self, seq_id: int) -> None:
        """Answer a `Resume`: the suspended sequence has a lane again and waits, preempted, to
        be replayed once its KV fits (a no-op if it ended meanwhile)."""
        if self._ledger.state_of(seq_id) is SeqState.SUSPENDED:
            self._ledger.preempt(self._ledger.sequence(seq_id))

    def take_out(self, sequence: LiveSequence) -> bool:
        """Remove an active sequence from the stepper in use, its KV state kept in the prefix
        cache for its replay. False if the removal failed: the batch is then recovered as
        after a failed step (the sequence is on probation)."""
        keep = self._reuse.cache is not None  # the replay reads memory only
        try:
            states = self._placement.current.remove([sequence.uid], keep_state=keep)
        except Exception as exc:  # noqa: BLE001 - the batch is suspect, as after a failed step
            self._recovery.recover(exc)
            return False
        kept = states.get(sequence.uid)
        if kept is not None:
            self._reuse.store([(sequence, kept)], self._counters.steps)
        return True

    def count(self, sequence: LiveSequence) -> None:
        sequence.yielded += 1
        self._counters.priority_preemptions[sequence.request.priority] += 1
