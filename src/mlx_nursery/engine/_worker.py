"""The engine thread: the only thread that touches MLX for the engine's whole life.

It starts up (`_startup.py`: the model loaded, the warm-up run, a `Runner` built), then runs
`Worker`'s loop until told to stop. It knows nothing of Trio: commands arrive on a
thread-safe queue, and everything leaves through the `Outbox`.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable

from .. import fault_points
from ..fault_points import request_label
from ._adapters import AdapterChange, RowAdapters
from ._config import EngineConfig
from ._device_thread import release_streams
from ._errors import EngineUnavailable
from ._ledger import Ledger
from ._messages import Cancel, Command, Delivery, ModelInfo, Stop, Submit, Wake, WorkerStats
from ._outbox import Outbox
from ._prefix_cache import PrefixCache
from ._runner import FatalEngineError, Runner
from ._sequence import FAILED_WHILE_SERVING
from ._startup import start_up
from ._types import FinishReason, GenerationRequest

__all__ = ["FatalEngineError", "Worker"]

log = logging.getLogger("mlx_nursery.engine")

_IDLE_POLL_SECONDS = 1.0


class Worker:
    """The engine thread's state machine.

    Each iteration of the loop, in this order:
      1. take the commands that arrived (blocking only while nothing runs);
      2. apply them: cancels first (the sequence ends: its final event and confirmation go
         to the outbox, and an active one is detaching), then submissions (held while a failed
         step's sequences are on probation or others wait for memory; cancelled if a stop
         came with them; else settled past the cancels, then admitted as the KV budget
         allows, the rest held); then suspensions and resumptions, in order (`_yielding`);
      3. settle: post what is due, then detach what ended from its stepper, then keep its
         KV state in the prefix cache;
      4. replay the next sequence on probation; or else replay the preempted sequences
         that fit the KV budget again, then admit the held submissions that fit; then start
         those whose cached prefix's read from disk is over (`_loading`); then run chunks of
         the image prompts' prefills, oldest first, up to `prefill_step_size` tokens, or
         fewer beside decoding sequences (`_chunking`; starting each once done);
      5. take the newest sequences out of the batch (preempted) while the step's KV would
         outgrow the budget; run one step of the stepper and emit each sequence's token;
         end the sequences whose sampler or logits processors failed in it;
      6. now and then, expire prefix-cache entries;
      7. settle again.

    The rules (each sequence's one state, and the only moves between states: `_ledger`):
      - each sequence is in exactly the one place its state names;
      - a final event carries the confirmation: the outbox posts both in one delivery;
      - the confirmation is posted before the sequence is detached (settle posts first), so
        a caller never waits on a detach or on a step whose tokens nobody will see;
      - an ended sequence is detached before any later command applies and before any later
        step, so a lane its confirmation freed is never used twice;
      - the prefix cache stores a sequence after its final event is posted (settle stores
        last), so no final event waits for a store;
      - one stepper holds the active sequences: the fast path's while a lone sequence runs,
        else the batch's (the other holds none once settled).
    `Ledger.check` asserts these after every iteration when `EngineConfig.check_invariants`
    is on (the test suite runs with it on).

    Anything that can fail for one request is guarded per request: building its sampler and
    processors, fetching its cached prefix, inserting it, the handover, reading its token.
    A step that fails where no guard sees is attributed by replay (`_recovery`).
    """

    def __init__(
        self,
        config: EngineConfig,
        post: Callable[[Delivery], None],
        on_ready: Callable[[ModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        self._config = config
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._outbox = Outbox(post, self._stats)
        self._ledger = Ledger(self._outbox, config.check_invariants, config.priority_aging)
        self._cache: PrefixCache | None = None
        self._runner: Runner | None = None

    @property
    def steps(self) -> int:
        """Steps run so far (read from Trio for cancellation accounting: an int, atomic)."""
        return self._runner.counters.steps if self._runner is not None else 0

    def submit(self, seq_id: int, request: GenerationRequest) -> None:
        self._commands.put(Submit(seq_id, request, request_label.get()))

    def cancel(self, seq_id: int) -> None:
        self._commands.put(Cancel(seq_id))

    def send(self, command: Command) -> None:
        self._commands.put(command)

    def change_adapter(self, change: AdapterChange) -> None:
        """Load or unload a LoRA adapter between steps (`_adapters.AdapterChange`)."""
        self._commands.put(change)

    def stop(self) -> None:
        self._commands.put(Stop())

    def wake(self) -> None:
        """Any thread: a read from disk is over (the disk tier's reader calls it)."""
        self._commands.put(Wake())

    def confirmation_seen(self) -> None:
        """The receiving side calls this once a caller has seen a sequence's end; see
        `Outbox.wait_for_caller`."""
        self._outbox.caller_saw_end()

    def run(self) -> None:
        try:
            ready = start_up(self._config, self._outbox, self._ledger, self.wake)
        except BaseException as exc:  # noqa: BLE001 - reported to the Trio side, which raises it
            self._on_ready(None, exc)
            self._on_exit(exc)
            return
        self._runner, self._cache, info = ready.runner, ready.cache, ready.info
        del ready  # the runner holds the model, until `_release_memory`
        self._on_ready(info, None)
        reason: BaseException | None = None
        try:
            self._loop(self._runner)
        except BaseException as exc:  # a dead loop must still release everyone
            log.exception("engine loop failed; the engine is stopping")
            reason = exc
        finally:
            self._finish_all("error" if reason else "cancelled", reason)
            self._outbox.post(closing="failed" if reason else "closed")
            self._release_memory(failed=reason is not None)
            self._on_exit(reason)

    def _loop(self, runner: Runner) -> None:
        ledger = self._ledger
        next_expiry_check = time.monotonic()
        distribution = self._config.distribution
        while True:
            if distribution is not None:
                distribution.tick()
            runner.release_idle_responses()
            if self._apply(runner, self._take_commands(block=ledger.idle())):
                return
            runner.settle()
            if ledger.on_probation():
                runner.recovery.replay_next_suspect()
            elif ledger.waiting():
                runner.admission.admit_waiting()
            if ledger.reading_from_disk():
                runner.loading.advance()
            if ledger.prefilling_images():
                runner.imaging.prefill()
            if ledger.stepping():
                runner.admission.make_room()
            if ledger.stepping():
                runner.step()
            if self._cache is not None and time.monotonic() >= next_expiry_check:
                next_expiry_check = time.monotonic() + min(_IDLE_POLL_SECONDS, self._cache.ttl)
                if runner.reuse.expire():
                    self._outbox.post(force=True)
            runner.settle()  # again for those the step ended
            if self._config.check_invariants:
                runner.check()

    def _take_commands(self, *, block: bool) -> list[Command]:
        commands: list[Command] = []
        if block:
            try:
                commands.append(self._commands.get(timeout=_IDLE_POLL_SECONDS))
            except queue.Empty:
                return commands
        while not self._commands.empty():  # this thread is the only reader
            commands.append(self._commands.get_nowait())
        return commands

    def _apply(self, runner: Runner, commands: list[Command]) -> bool:
        """Apply commands; return True on Stop. Cancels win over submits of the same batch."""
        if not commands:
            return False
        stop = any(isinstance(c, Stop) for c in commands)
        bank = runner.model.adapters
        for command in commands:  # between steps: no forward is being built
            if isinstance(command, AdapterChange):
                RowAdapters(bank).apply(command)
        cancelled = {c.seq_id for c in commands if isinstance(c, Cancel)}
        for seq_id in cancelled:
            runner.cancel(seq_id)
        admitted: list[Submit] = []
        for command in commands:
            if isinstance(command, Submit):
                if fault_points.ARMED:  # the engine's own loop failing: the thread dies
                    fault_points.reach("engine_loop", command.label)
                if stop or command.seq_id in cancelled:
                    self._ledger.end_unstarted(command, "cancelled")
                else:
                    admitted.append(command)
        ledger = self._ledger
        if admitted and ledger.waiting():
            runner.admission.hold(admitted, count=not ledger.on_probation())
        elif admitted:
            runner.settle()  # what the cancels ended leaves its stepper before anyone enters
            runner.admission.admit_all(admitted)
        runner.yielding.apply(commands)  # after the submissions: one may be asked for at once
        return stop

    def _finish_all(self, reason: FinishReason, exc: BaseException | None) -> None:
        """On exit: end every sequence, running or queued; nobody waits forever."""
        error = FAILED_WHILE_SERVING if exc is not None else None
        for sequence in self._ledger.started():
            self._ledger.finish(sequence, sequence.final(reason, error))
        error = "the engine stopped before serving this request" if exc is not None else None
        for command in [*self._ledger.held(), *self._take_commands(block=False)]:
            if isinstance(command, Submit):
                self._ledger.end_unstarted(command, reason, error)
            elif isinstance(command, AdapterChange):
                command.done(EngineUnavailable("the engine stopped"))

    def _stats(self) -> WorkerStats:
        runner = self._runner
        if runner is None:
            return WorkerStats(0, self._ledger.running, 0, 0, 0, None)
        counters = runner.counters
        return WorkerStats(
            steps=counters.steps,
            active=self._ledger.running,
            prompt_tokens_processed=runner.prefilled,
            generated_tokens=counters.generated_tokens,
            failed_steps=counters.failed_steps,
            prefix_cache=self._cache.stats() if self._cache else None,
            solo_steps=counters.solo_steps,
            handovers=counters.handovers,
            isolated_failures=counters.isolated_failures,
            replays=counters.replays,
            prefill_forwards=runner.shapes.prefill_forwards,
            prefill_shapes=runner.shapes.shapes,
            prefill_chunks_beside_decode=dict(runner.chunks.beside_decode),
            prefill_seconds_per_token=runner.chunks.seconds_per_token,
            preemptions=counters.preemptions,
            held_for_memory=counters.held_for_memory,
            priority_preemptions=dict(counters.priority_preemptions),
            verify_steps=counters.verify_steps,
            draft_tokens=counters.draft_tokens,
            accepted_draft_tokens=counters.accepted_draft_tokens,
            prefix_disk=runner.reuse.disk_stats(),
        )

    def _release_memory(self, *, failed: bool) -> None:
        if self._cache is not None:
            self._cache.clear()
        if self._runner is not None:
            self._runner.close()  # synchronize() below lands their steps in flight
            self._runner = None
        if self._config.distribution is not None:
            self._config.distribution.close(failed=failed)
        # The batch pipelines one step ahead: that work lands on this thread's stream
        # before the thread (and its stream) goes away.
        release_streams()
