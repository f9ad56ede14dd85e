"""The step loop's coordinator: one step for the active sequences, then settling what ended.

The engine thread's `Worker` owns the thread, the commands and the loop; each iteration it
drives a `Runner`, which holds one loaded model's parts and keeps the rules stated in the
worker's docstring:

- `Ledger` (`_ledger.py`): each sequence's one state, moved only there;
- `Placement` (`_placement.py`): the two steppers, which one is in use, the handover;
- `Admission` (`_admission.py`): submissions in as the KV budget allows, held, preempted;
- `Yielding` (`_yielding.py`): sequences taken off the device for better priorities;
- `Imaging` (`_imaging.py`): image prompts' prefill, a chunk per iteration;
- `Loading` (`_loading.py`): sequences waiting on their cached prefix's read from disk;
- `Recovery` (`_recovery.py`): failed steps and replays;
- `PrefixReuse` (`_reuse.py`): the prefix cache's fetches and stores;
- `Emitter` (`_emitting.py`): responses into events;
- `RunCounters` (`_counters.py`): what all of them count.

Engine thread only.
"""

from __future__ import annotations

import logging

import mlx.core as mx

from .. import fault_points
from ..models import LoadedModel
from ._admission import Admission
from ._chunking import ChunkSizer
from ._config import EngineConfig
from ._counters import RunCounters
from ._disk_kv import DiskKV
from ._emitting import Emitter
from ._imaging import Imaging
from ._ledger import Ledger, SeqState
from ._loading import Loading
from ._memory import KVBudget
from ._outbox import Outbox
from ._placement import Placement
from ._prefix_cache import PrefixCache
from ._recovery import FatalEngineError, Recovery
from ._reuse import PrefixReuse
from ._scripted import ScriptedFault
from ._shapes import ShapeWatch
from ._yielding import Yielding

__all__ = ["FatalEngineError", "Runner"]

log = logging.getLogger("mlx_nursery.engine")

_HELD_BY_NO_STEPPER = (
    SeqState.PROBATION,
    SeqState.PREEMPTED,
    SeqState.SUSPENDED,
    SeqState.IMAGING,
    SeqState.LOADING,
)

MAX_REASON_CHARS = 500
"""Of an exception's text kept in logs and error events (a grammar's may quote all of it)."""


class Runner:
    """Runs the sequences of one loaded model on its two steppers, one at a time."""

    def __init__(
        self,
        config: EngineConfig,
        model: LoadedModel,
        cache: PrefixCache | None,
        outbox: Outbox,
        ledger: Ledger,
        budget: KVBudget,
        disk: DiskKV | None = None,
    ) -> None:
        self.model = model
        self._outbox = outbox
        self._ledger = ledger
        self.counters = RunCounters()
        counters = self.counters
        self._stepped_since_flush = False
        self._emitter = Emitter(ledger, outbox, counters)
        self.placement = Placement(config, model, ledger, outbox, self._emitter, counters)
        chunks = self.placement.chunks
        self._reuse = PrefixReuse(model, cache, disk, lambda: chunks.seconds_per_token)
        self.imaging = Imaging(model, ledger, self.placement)
        self.loading = Loading(ledger, self.placement, self._reuse, self.imaging, outbox)
        self.recovery = Recovery(
            config, model, ledger, self.placement, self.imaging, counters, self._reuse
        )
        self.yielding = Yielding(
            ledger, self.placement, self._reuse, self.recovery, counters, outbox,
            config.max_preemptions,
        )  # fmt: skip
        eos = frozenset(int(t) for t in model.tokenizer.eos_token_ids)
        self.admission = Admission(
            ledger,
            budget,
            self.placement,
            self._reuse,
            self.imaging,
            self.loading,
            self.recovery,
            counters,
            eos,
            outbox,
            self.yielding,
        )

    @property
    def prefilled(self) -> int:
        return self.placement.prefilled

    @property
    def shapes(self) -> ShapeWatch:
        return self.placement.shapes

    @property
    def chunks(self) -> ChunkSizer:
        return self.placement.chunks

    def cancel(self, seq_id: int) -> None:
        """End the sequence now, wherever it runs or waits (a no-op once it has ended)."""
        ledger = self._ledger
        state = ledger.state_of(seq_id)
        if state is SeqState.ACTIVE:
            ledger.remove(ledger.sequence(seq_id), self.placement.current, "cancelled")
        elif state is SeqState.HELD:
            ledger.end_unstarted(ledger.submission(seq_id), "cancelled")
        elif state in _HELD_BY_NO_STEPPER:
            sequence = ledger.sequence(seq_id)  # held by no stepper
            ledger.finish(sequence, sequence.final("cancelled"))

    def release_idle_responses(self) -> None:
        """With nothing to step: drop the last step's responses (no next step to wait for)
        and, once per idle spell, flush MLX's buffer cache, which the steps' varying shapes
        grow (mlx-lm flushes it between steps; this engine only where no step waits)."""
        if self._ledger.stepping():
            return
        self.placement.previous_responses = []
        if self._stepped_since_flush:
            self._stepped_since_flush = False
            mx.clear_cache()

    def check(self) -> None:
        self._ledger.check(self.placement.current, self.placement.unused)

    def close(self) -> None:
        self.placement.close()
        self._ledger.drop_detaching()
        self._ledger.take_stored()
        self._reuse.close()  # the disk tier's writes handed over, and done

    @property
    def reuse(self) -> PrefixReuse:
        return self._reuse

    def settle(self) -> None:
        """Post what is due, then detach and store what ended. Called twice per token, so
        the common case (nothing ended) is a few checks: a lone stream's tokens are bound by
        this thread's Python."""
        self._outbox.post_due(token_in_flight=self.placement.current.token_in_flight)
        if self._ledger.detaching():
            self._detach()
            self._outbox.post_due(token_in_flight=False)  # a failed detach may end some
        if self._ledger.storing():
            self._reuse.store(self._ledger.take_stored(), self.counters.steps)
        self._reuse.hand_over(self.counters.steps, now=not self._ledger.stepping())

    def step(self) -> None:
        """One decode step (or prefill chunk) for every active sequence."""
        ledger = self._ledger
        stepper = self.placement.current
        try:
            if fault_points.ARMED:  # a test's fault in the step itself, as a forward would fail
                for live in ledger.active():
                    started = bool(live.tokens)  # a replay keeps its tokens: still decoding
                    point: fault_points.Point = "decode_step" if started else "prefill"
                    fault_points.reach(point, live.label)
            responses = stepper.step()
        except Exception as exc:  # noqa: BLE001 - attributed, if at all, by recover
            self.recovery.recover(exc)
            return
        self.placement.previous_responses = responses
        self._stepped_since_flush = True
        counters = self.counters
        counters.steps += 1
        counters.solo_steps += stepper.kind == "solo"
        counters.failures_in_a_row = 0
        for response in responses:
            sequence = ledger.by_uid(response.uid)
            if sequence is not None:
                sequence.newcomer = False
                self._emitter.checked(sequence, response, stepper)
        # The step returns token k while it computes token k+1 (pipelined), so a processor
        # failure recorded now concerns a token nobody has seen: emit k, never k+1.
        for sequence in ledger.failed_in_step():
            failure = sequence.failures[0]
            reason = repr(failure)[:MAX_REASON_CHARS]  # may quote a whole grammar
            if isinstance(failure, ScriptedFault):  # the scripted model's, as its script asked
                ledger.remove(sequence, stepper, "error", str(failure))
                continue
            log.warning(
                "logits processor or sampler failed for sequence %d: %s", sequence.seq_id, reason
            )
            ledger.remove(sequence, stepper, "error", f"sampling failed: {reason}")

    def _detach(self) -> None:
        """Take ended sequences out of their stepper, keeping their KV state (one removal per
        stepper: each filters every layer's KV of the whole batch)."""
        self._outbox.wait_for_caller()
        detaching = self._ledger.to_detach()
        keep_state = self._reuse.keeps_state
        for stepper in {id(stepper): stepper for _, stepper in detaching}.values():
            ended = [sequence for sequence, s in detaching if s is stepper]
            try:
                states = stepper.remove([s.uid for s in ended], keep_state=keep_state)
            except Exception as exc:  # noqa: BLE001 - the batch is suspect, as after a failed step
                self._ledger.drop_detaching()
                self.recovery.recover(exc)
                return
            for sequence in ended:
                kept = None if sequence.failures else states.get(sequence.uid, (None, None))
                self._ledger.detached(sequence, kept)
