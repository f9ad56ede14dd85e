"""Admission within the KV budget: submissions in, held, preempted and replayed.

A submission is admitted if the KV budget takes every sequence's KV with room to grow, or
if taking active sequences of a worse priority out of the batch makes it fit (`_yielding`);
from the first that it cannot take, the rest are held, by priority, then in order. Before
each step sequences are preempted, the worst priority's newest first, while the step's KV
would outgrow the budget; each is replayed (its prompt and tokens so far prefilled again,
or read back from the prefix cache; its sampler rewound: the same tokens follow) once it
fits, before any held submission of its priority or worse is admitted. Engine thread only.
"""

from __future__ import annotations

import logging

from .. import fault_points
from ._counters import RunCounters
from ._imaging import Imaging
from ._ledger import Ledger, SeqState
from ._loading import Loading
from ._memory import KV_STEP, KVBudget
from ._messages import StepEvent, Submit
from ._outbox import Outbox
from ._placement import Placement
from ._recovery import Recovery
from ._reuse import PrefixReuse
from ._sequence import COULD_NOT_START, LiveSequence, build_sequence
from ._stepper import Start, Stepper
from ._yielding import Yielding

log = logging.getLogger("mlx_nursery.engine")


def _worst_newest(sequence: LiveSequence) -> tuple[int, int]:
    """Orders sequences to take out of the batch: the worst priority, the newest, last."""
    return sequence.request.priority, sequence.seq_id


class Admission:
    """Puts submissions into steppers as the KV budget allows (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        budget: KVBudget,
        placement: Placement,
        reuse: PrefixReuse,
        imaging: Imaging,
        loading: Loading,
        recovery: Recovery,
        counters: RunCounters,
        eos: frozenset[int],
        outbox: Outbox,
        yielding: Yielding,
    ) -> None:
        self._ledger = ledger
        self._budget = budget
        self._placement = placement
        self._reuse = reuse
        self._imaging = imaging
        self._loading = loading
        self._recovery = recovery
        self._counters = counters
        self._eos = eos
        self._outbox = outbox
        self._yielding = yielding

    def admit_all(self, commands: list[Submit], *, arriving: bool = True) -> None:
        """A lone sequence takes the fast path; any company moves everyone into the batch.
        From the first that the KV budget cannot take with room to grow, the rest are held,
        in order (a preempted sequence waits before them: see `admit_waiting`)."""
        lengths = self._lengths()
        admitted: list[Submit] = []
        for i, command in enumerate(commands):
            length = len(command.request.prompt_tokens)
            if not self._budget.fits([*lengths, length], growth=KV_STEP):
                rank = self._ledger.rank(command.seq_id, command.request.priority)
                room = self._room_for(rank, lengths, length)
                if room is None:
                    self.hold(commands[i:], count=arriving)
                    break
                lengths = room
            lengths.append(length)
            admitted.append(command)
        if not admitted:
            return
        placement = self._placement
        if len(admitted) == 1 and placement.fast_path and not self._ledger.in_company():
            self._admit(admitted[0], placement.solo)
            return
        placement.hand_over()
        for command in admitted:
            self._admit(command, placement.batch)

    def hold(self, commands: list[Submit], *, count: bool) -> None:
        """Hold submissions back, behind those held already (one held already keeps its
        place). `count`: they wait for KV memory (`held_for_memory`), not only behind
        sequences on probation."""
        self._ledger.hold(commands)
        self._counters.held_for_memory += count * len(commands)

    def admit_waiting(self) -> None:
        """Replay the preempted sequences that fit again and admit held submissions, by
        class (`Ledger.rank`: priority, and aging; a preempted sequence first within its
        class, oldest preemption first); nothing overtakes one that does not fit yet."""
        ledger = self._ledger
        while (sequence := ledger.next_preempted()) is not None:
            rank = ledger.rank(sequence.seq_id, sequence.request.priority)
            better = [c for c in ledger.held() if ledger.rank(c.seq_id, c.request.priority) < rank]
            if better:
                self.admit_all(better, arriving=False)
                if any(ledger.state_of(c.seq_id) is SeqState.HELD for c in better):
                    return
                continue
            length = len(sequence.request.prompt_tokens) + len(sequence.tokens)
            lengths = self._lengths()
            if not self._budget.fits([*lengths, length], growth=KV_STEP) and (
                self._room_for(rank, lengths, length) is None
            ):
                return
            self._placement.hand_over()
            self._recovery.replay(sequence, after_failure=False)
        self.admit_all(ledger.held(), arriving=False)

    def make_room(self) -> None:
        """Before a step: take sequences out of the batch, the worst priority's newest first,
        until the step's KV fits the budget; each waits as preempted and is replayed when it
        fits."""
        ledger = self._ledger
        while ledger.may_be_preempted() and not self._budget.fits(self._lengths(), growth=1):
            victim = max(ledger.active(), key=_worst_newest)
            try:
                self._placement.current.remove([victim.uid], keep_state=False)
            except Exception as exc:  # noqa: BLE001 - the batch is suspect, as after a failed step
                self._recovery.recover(exc)
                return
            ledger.preempt(victim)
            self._counters.preemptions += 1
            log.info("sequence %d preempted: the batch's KV would outgrow it", victim.seq_id)

    def _room_for(self, rank: int, lengths: list[int], length: int) -> list[int] | None:
        """Make room for a sequence of `length` tokens and class `rank` beside others of
        `lengths` (the active ones', and those admitted before it) by taking active sequences
        of a worse priority that may still yield out of the batch (worst, newest first; each
        preempted, its lane kept): the lengths left, or None, nothing taken, if that cannot
        make it fit."""
        left, victims = list(lengths), []
        limit = self._yielding.limit
        found = [s for s in self._ledger.active() if s.request.priority > rank]
        for victim in sorted(found, key=_worst_newest, reverse=True):
            if victim.yielded >= limit:
                continue
            if self._budget.fits([*left, length], growth=KV_STEP):
                break
            left.remove(len(victim.request.prompt_tokens) + len(victim.tokens))
            victims.append(victim)
        if not self._budget.fits([*left, length], growth=KV_STEP):
            return None
        for victim in victims:
            if not self._yielding.take_out(victim):
                return None  # the batch was recovered: its sequences wait on probation
            self._yielding.count(victim)
            self._ledger.preempt(victim)
            log.info("sequence %d preempted for a request of a better priority", victim.seq_id)
        return left

    def _lengths(self) -> list[int]:
        """Tokens each active sequence's KV holds (or will, once its prompt is prefilled),
        image prompts being prefilled included."""
        return [len(s.request.prompt_tokens) + len(s.tokens) for s in self._ledger.kv_holders()]

    def _admit(self, command: Submit, stepper: Stepper) -> None:
        """Start one sequence in `stepper` (an image prompt: its prefill, unless a cached
        prefix covers every image), or, where the disk holds a longer cached prefix than
        memory, begin its read (the sequence starts once it is over: `_loading`). Anything
        that fails here fails this request alone."""
        try:
            sequence = build_sequence(command, self._eos)
            if fault_points.ARMED:
                fault_points.reach("admission", command.label)
            prompt = list(command.request.prompt_tokens)
            max_tokens = command.request.max_tokens
            hit = self._reuse.fetch(sequence, prompt)
            read = self._reuse.read_from_disk(sequence, prompt, hit)
            if read is not None:
                self._loading.begin(sequence, prompt, read)
                return
            uid = None
            if hit is not None:
                cached = hit.cached_tokens
                start = Start(prompt[cached:], hit.cache, prompt[:cached], max_tokens)
                try:
                    uid = stepper.insert(sequence, start)
                    sequence.cached_tokens = cached
                except Exception:  # noqa: BLE001 - a cached state that will not merge: prefill afresh
                    self._reuse.record_failure()
            if uid is None and command.request.images is not None:
                self._imaging.begin(sequence, prompt, command.request.images)
                self._report_admission(sequence)
                return
            if uid is None:
                uid = stepper.insert(sequence, Start(prompt, None, [], max_tokens))
        except Exception:  # fails this request only
            log.exception("could not admit sequence %d", command.seq_id)
            self._ledger.end_unstarted(command, "error", COULD_NOT_START)
            return
        self._placement.placed(stepper, sequence, uid)
        self._report_admission(sequence)

    def _report_admission(self, sequence: LiveSequence) -> None:
        """The admission event of a request that asks for it (`report_admission`): its
        prompt's usage, its prefix cache read known, before any token."""
        if sequence.request.report_admission:
            self._outbox.token(sequence.seq_id, StepEvent(None, usage=sequence.usage()))
