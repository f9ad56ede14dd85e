"""Where each sequence is on the engine thread: one state per sequence, moved only here.

From the moment the engine thread holds a submission until it is gone, the sequence has
exactly one `SeqState`; the `Ledger` is the one place that moves it from state to state,
and the one way it ends (`remove`, `finish`, `end_unstarted`: its final event and the
confirmation that it computes nothing more go to the outbox together, once). A sequence
not in the ledger is either still in the command queue or gone.

Everyone else asks the ledger named questions (`idle`, `stepping`, `in_company`, `waiting`,
`may_be_preempted`, ...) rather than reading its containers, so that a new state means a new
enum member and the ledger's answers, nothing else. `check` asserts the rules after every
settled iteration when `EngineConfig.check_invariants` is on (the test suite runs so).
"""

from __future__ import annotations

import enum
from collections import Counter

from ._messages import StepEvent, Submit
from ._outbox import Outbox
from ._sequence import LiveSequence, unstarted_end
from ._stepper import KVState, Stepper
from ._types import FinishReason


class SeqState(enum.Enum):
    """Where a sequence is. Each state's sequences are kept in the order they entered it."""

    HELD = "held"
    """Submitted and waiting, as its `Submit` (no sequence is built yet): while others are on
    probation (new arrivals, each a newcomer for all its prefill, must not keep a suspect
    from its replay), or until the KV budget takes it (after the preempted)."""
    LOADING = "loading"
    """Its cached prefix being read from disk, then copied into MLX arrays
    (`LiveSequence.loading`, `_loading`); held by no stepper until it starts."""
    IMAGING = "imaging"
    """Its prompt, which holds images, being prefilled a chunk per iteration
    (`LiveSequence.prefill`); held by no stepper until done."""
    ACTIVE = "active"
    """In the current stepper, under its uid."""
    PROBATION = "probation"
    """In a step that failed: held by no stepper until replayed (`_recovery`)."""
    PREEMPTED = "preempted"
    """Taken out of the batch to stay within the KV budget, or for a request of a better
    priority, or resumed after a suspension: held by no stepper until replayed, once it fits."""
    SUSPENDED = "suspended"
    """Taken off the device for a request of a better class, its lane given up: held by no
    stepper, and not running, until its request has a lane again (then preempted)."""
    DETACHING = "detaching"
    """Ended (its final event is out); still in its stepper until the next settle."""
    STORING = "storing"
    """Ended and out of every stepper; its KV state waits for the prefix cache."""


_NOT_ENDED = (
    SeqState.HELD,
    SeqState.LOADING,
    SeqState.IMAGING,
    SeqState.ACTIVE,
    SeqState.PROBATION,
    SeqState.PREEMPTED,
    SeqState.SUSPENDED,
)
"""The states of sequences that are running or waiting to (`Ledger.running` counts them, but
the suspended, which wait for a lane): none of them may hold a sequence that has ended."""
_WAITING_FOR_MEMORY = (SeqState.HELD, SeqState.PREEMPTED)
_KV_HOLDING = (SeqState.ACTIVE, SeqState.IMAGING, SeqState.LOADING)


class InvariantViolation(RuntimeError):
    """The engine thread's bookkeeping broke one of its rules: a bug; the engine stops."""


class Ledger:
    """Every sequence's state, and the only code that changes it. Engine thread only."""

    def __init__(self, outbox: Outbox, checking: bool, aging: int = 8) -> None:
        self._outbox = outbox
        self._checking = checking
        self._aging = aging
        self._passed: Counter[int] = Counter()
        """seq_id -> sequences of a better priority that started while it waited for memory."""
        self._state: dict[int, SeqState] = {}
        """seq_id -> its one state: the truth; the containers below index it."""
        self._held: dict[int, Submit] = {}
        self._sequences: dict[SeqState, dict[int, LiveSequence]] = {
            state: {} for state in SeqState if state is not SeqState.HELD
        }
        """Per state but HELD: seq_id -> sequence, in the order they entered it."""
        # Each state's container by name too: the questions below run every iteration, and
        # an enum member's hash is Python code.
        self._active = self._sequences[SeqState.ACTIVE]
        self._imaging = self._sequences[SeqState.IMAGING]
        self._loading = self._sequences[SeqState.LOADING]
        self._probation = self._sequences[SeqState.PROBATION]
        self._preempted = self._sequences[SeqState.PREEMPTED]
        self._detaching = self._sequences[SeqState.DETACHING]
        self._storing = self._sequences[SeqState.STORING]
        self._by_uid: dict[int, LiveSequence] = {}
        """The active sequences by their uid in the current stepper."""
        self._detaching_from: dict[int, Stepper] = {}
        """seq_id -> the stepper a detaching sequence is still in."""
        self._kept: dict[int, KVState] = {}
        """seq_id -> the KV state a storing sequence left."""
        self._gone: set[int] = set()  # only while checking

    # -- questions ---------------------------------------------------------------------------
    def state_of(self, seq_id: int) -> SeqState | None:
        """Its state (None: not yet taken from the command queue, or gone)."""
        return self._state.get(seq_id)

    @property
    def running(self) -> int:
        """Sequences admitted and not ended, or waiting to be."""
        waiting = len(self._held) + len(self._probation) + len(self._preempted)
        return waiting + len(self._active) + len(self._imaging) + len(self._loading)

    def idle(self) -> bool:
        """Nothing runs or waits but reads from disk in flight: the loop may block until a
        command comes (a read's end comes as one, `Wake`)."""
        if self.running != len(self._loading):
            return False
        return not any(s.loading.ready for s in self._loading.values())

    def stepping(self) -> bool:
        """Some sequence is in the current stepper: there is a step to run."""
        return bool(self._active)

    def in_company(self) -> bool:
        """A sequence starting now would not be alone on the device: others are active, or
        wait to be replayed into the batch (the fast path is for a lone sequence)."""
        return bool(self._active or self._probation or self._preempted)

    def waiting(self) -> bool:
        """Arrivals must wait behind others: sequences on probation, preempted or held."""
        return bool(self._held or self._probation or self._preempted)

    def on_probation(self) -> bool:
        """Sequences of a failed step wait to be replayed (arrivals are held meanwhile)."""
        return bool(self._probation)

    def prefilling_images(self) -> bool:
        return bool(self._imaging)

    def reading_from_disk(self) -> bool:
        return bool(self._loading)

    def loading(self) -> list[LiveSequence]:
        """The sequences whose cached prefix is read from disk, oldest first."""
        return list(self._loading.values())

    def detaching(self) -> bool:
        return bool(self._detaching)

    def storing(self) -> bool:
        return bool(self._storing)

    def active(self) -> list[LiveSequence]:
        """The active sequences, oldest first."""
        return list(self._active.values())

    def by_uid(self, uid: int) -> LiveSequence | None:
        """The active sequence under `uid` in the current stepper (None: none is)."""
        return self._by_uid.get(uid)

    def sequence(self, seq_id: int) -> LiveSequence:
        """The sequence `seq_id`, in any state but HELD (KeyError: none)."""
        return self._sequences[self._state[seq_id]][seq_id]

    def submission(self, seq_id: int) -> Submit:
        """The held submission `seq_id` (KeyError: none is held)."""
        return self._held[seq_id]

    def held(self) -> list[Submit]:
        """The held submissions, in the order they are to be admitted: by class, then in the
        order they came."""
        return sorted(self._held.values(), key=lambda c: self.rank(c.seq_id, c.request.priority))

    def imaging(self) -> list[LiveSequence]:
        """The image prompts being prefilled, oldest first."""
        return list(self._imaging.values())

    def failed_in_step(self) -> list[LiveSequence]:
        """Active sequences whose sampler or logits processors raised."""
        return [s for s in self._active.values() if s.failures]

    def kv_holders(self) -> list[LiveSequence]:
        """Sequences whose KV is on the device, or being built there: the active ones, the
        image prompts being prefilled and the prefixes being read from disk."""
        return [*self._active.values(), *self._imaging.values(), *self._loading.values()]

    def may_be_preempted(self) -> bool:
        """Active sequences have company in the stepper (a lone one is never preempted:
        nothing would be left to make progress)."""
        return len(self._active) > 1

    def rank(self, seq_id: int, priority: int) -> int:
        """The class of a sequence of `priority` waiting for KV memory (held or preempted):
        less one for every `aging` sequences of a better priority that started while it
        waited (the lanes' aging, `_priority`, for the wait for memory)."""
        return priority - self._passed.get(seq_id, 0) // self._aging

    def next_preempted(self) -> LiveSequence | None:
        """The preempted sequence to replay first: of the best class, preempted first."""
        if not self._preempted:
            return None
        return min(self._preempted.values(), key=lambda s: self.rank(s.seq_id, s.request.priority))

    def next_suspect(self) -> LiveSequence | None:
        """The next sequence on probation to replay, once no newcomer is active (each suspect
        is replayed as the one newcomer in its batch: `_recovery`)."""
        if any(s.newcomer for s in self._active.values()):
            return None
        return next(iter(self._probation.values()), None)

    def started(self) -> list[LiveSequence]:
        """Every sequence built and not ended: active, on probation, preempted, suspended,
        imaging, loading."""
        states = (SeqState.ACTIVE, SeqState.PROBATION, SeqState.PREEMPTED, SeqState.SUSPENDED)
        started = [s for state in states for s in self._sequences[state].values()]
        return [*started, *self.imaging(), *self.loading()]

    # -- moves -------------------------------------------------------------------------------
    def hold(self, commands: list[Submit]) -> None:
        """Hold submissions, in order, behind those held already (one held already keeps its
        place)."""
        for command in commands:
            if self._state.get(command.seq_id) is not SeqState.HELD:
                self._state[command.seq_id] = SeqState.HELD
                self._held[command.seq_id] = command

    def activate(self, sequence: LiveSequence, uid: int) -> None:
        """`sequence` is in the current stepper under `uid` (a newcomer until its first
        token), from wherever it was (an active one moved to another stepper included)."""
        self._move(sequence, SeqState.ACTIVE)
        sequence.newcomer = True
        sequence.uid = uid
        self._by_uid[uid] = sequence

    def begin_loading(self, sequence: LiveSequence) -> None:
        """`sequence.loading` is set: its cached prefix is being read from disk."""
        self._move(sequence, SeqState.LOADING)

    def begin_imaging(self, sequence: LiveSequence) -> None:
        """`sequence.prefill` is set: its image prompt is prefilled a chunk per iteration."""
        self._move(sequence, SeqState.IMAGING)

    def to_probation(self, sequence: LiveSequence) -> None:
        self._move(sequence, SeqState.PROBATION)

    def preempt(self, sequence: LiveSequence) -> None:
        """`sequence`, taken out of its stepper (or resumed), waits for KV memory."""
        self._move(sequence, SeqState.PREEMPTED)

    def suspend(self, sequence: LiveSequence) -> None:
        """`sequence`, held by no stepper (any more), gives up its lane."""
        self._move(sequence, SeqState.SUSPENDED)

    def remove(
        self,
        sequence: LiveSequence,
        stepper: Stepper,
        reason: FinishReason,
        error: str | None = None,
    ) -> None:
        """End an active sequence now: no step runs for it after this. Its confirmation is
        posted by the next settle, which then detaches it from `stepper`."""
        self._move(sequence, SeqState.DETACHING)
        self._detaching_from[sequence.seq_id] = stepper
        self.end(sequence.seq_id, sequence.final(reason, error))

    def finish(self, sequence: LiveSequence, event: StepEvent, kept: KVState | None = None) -> None:
        """End a sequence held by no stepper (any more); `kept`: the KV state it leaves for
        the prefix cache."""
        self.end(sequence.seq_id, event)
        self._keep_or_forget(sequence, kept)

    def end_unstarted(
        self, command: Submit, reason: FinishReason, error: str | None = None
    ) -> None:
        """End a submission that never started (held, or straight from the queue)."""
        self._leave(command.seq_id)
        self.end(command.seq_id, unstarted_end(command, reason, error))

    def end(self, seq_id: int, event: StepEvent) -> None:
        """The final event and the confirmation, once (the moves above call it)."""
        if self._checking:
            if seq_id in self._gone:
                raise InvariantViolation(f"sequence {seq_id} ended twice")
            self._gone.add(seq_id)
        self._outbox.end(seq_id, event)

    def to_detach(self) -> list[tuple[LiveSequence, Stepper]]:
        """The detaching sequences and their steppers, in the order they ended (each stays
        detaching until `detached` or `drop_detaching`)."""
        detaching = self._detaching.values()
        return [(s, self._detaching_from[s.seq_id]) for s in detaching]

    def detached(self, sequence: LiveSequence, kept: KVState | None) -> None:
        """`sequence` is out of its stepper; `kept`: the KV state it leaves (None: nothing
        to store)."""
        self._keep_or_forget(sequence, kept)

    def drop_detaching(self, stepper: Stepper | None = None) -> None:
        """Forget the sequences still to detach from `stepper` (None: from any): it is gone."""
        for sequence, source in self.to_detach():
            if stepper is None or source is stepper:
                self._leave(sequence.seq_id)

    def take_stored(self) -> list[tuple[LiveSequence, KVState]]:
        """The storing sequences and their KV states; they are gone."""
        storing = list(self._storing.values())
        kept = [(s, self._kept[s.seq_id]) for s in storing]
        for sequence in storing:
            self._leave(sequence.seq_id)
        return kept

    def _keep_or_forget(self, sequence: LiveSequence, kept: KVState | None) -> None:
        if kept is None:
            self._leave(sequence.seq_id)
            return
        self._move(sequence, SeqState.STORING)
        self._kept[sequence.seq_id] = kept

    def _move(self, sequence: LiveSequence, to: SeqState) -> None:
        """The one move: out of its state (if any), into `to`, at the end of its order."""
        if self._state.get(sequence.seq_id) in _WAITING_FOR_MEMORY and to in _KV_HOLDING:
            self._pass(sequence.request.priority)
        self._leave(sequence.seq_id)
        self._state[sequence.seq_id] = to
        self._sequences[to][sequence.seq_id] = sequence

    def _pass(self, priority: int) -> None:
        """A sequence of `priority` starts after waiting for memory: it passed the worse ones."""
        waiting = {i: c.request.priority for i, c in self._held.items()}
        waiting.update((i, s.request.priority) for i, s in self._preempted.items())
        self._passed.update(i for i, worse in waiting.items() if worse > priority)

    def _leave(self, seq_id: int) -> None:
        """Out of its state (a no-op if it has none), and of that state's indexes."""
        self._passed.pop(seq_id, None)
        state = self._state.pop(seq_id, None)
        if state is None:
            return
        if state is SeqState.HELD:
            del self._held[seq_id]
            return
        sequence = self._sequences[state].pop(seq_id)
        if state is SeqState.ACTIVE:
            del self._by_uid[sequence.uid]
        elif state is SeqState.IMAGING:
            sequence.prefill = None  # an image prefill's partial KV goes with it
        elif state is SeqState.LOADING:
            sequence.loading.cancel()  # a read not started is skipped, a result dropped
            sequence.loading = None
        elif state is SeqState.DETACHING:
            del self._detaching_from[seq_id]
        elif state is SeqState.STORING:
            del self._kept[seq_id]

    # -- the rules ---------------------------------------------------------------------------
    def check(self, stepper: Stepper, idle: Stepper) -> None:
        """Assert the rules after a settled iteration (`Worker`'s docstring)."""
        problems = []
        if self.detaching() or self.storing() or self._outbox.confirming:
            problems.append("an ended sequence was not posted, detached and stored")
        if len(self._by_uid) != len(self._active) or any(
            self._by_uid.get(s.uid) is not s for s in self._active.values()
        ):
            problems.append("a uid maps to no active sequence, or an active one to no uid")
        if set(self._by_uid) != stepper.uids:
            problems.append("the current stepper does not hold exactly the active sequences")
        if idle.uids or idle.drafting:
            problems.append("the stepper not in use holds sequences")
        if not stepper.drafting <= stepper.uids:
            problems.append("a batch row drafts for a sequence the batch does not hold")
        if self._misplaced():
            problems.append("a sequence is in two places, or where its state does not say")
        not_ended = [i for i, state in self._state.items() if state in _NOT_ENDED]
        if self._gone.intersection(not_ended):
            problems.append("a sequence is back after its end")
        if problems:
            raise InvariantViolation("; ".join(problems))

    def _misplaced(self) -> bool:
        """Whether any sequence is not in exactly the one container its state names."""
        places = Counter(self._held.keys())
        for sequences in self._sequences.values():
            places.update(sequences.keys())
        if any(count != 1 for count in places.values()) or places.keys() != self._state.keys():
            return True
        held_right = all(self._state[i] is SeqState.HELD for i in self._held)
        return not held_right or any(
            self._state[i] is not state
            for state, sequences in self._sequences.items()
            for i in sequences
        )
