"""The engine's Trio side: admission, lanes, delivery, cancellation.

Lanes are `FairLanes` (a capacity limiter fair among tenants): a request borrows
a token (cancellable) before its sequence is submitted, and the token is returned by
the engine thread's confirmation that the sequence left the batch, never
earlier. So `limiter.borrowed_tokens` is exactly the number of sequences that
may still be computing.

Cancellation contract of `Engine.generate`: when the caller's scope is
cancelled (or the caller leaves the block early), the sequence is cancelled
on the engine thread before its next step, and `generate` waits, shielded and
bounded by `cancel_ack_timeout`, for the confirmation. Leaving the block
therefore means the compute has stopped.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Literal

import attrs
import trio

from ._config import EngineConfig
from ._errors import EngineOverloaded, EngineUnavailable, PromptTooLong
from ._lanes import FairLanes
from ._messages import Delivery, ModelInfo, StepEvent, WorkerStats
from ._statistics import CancelRecorder, CancelStatistics
from ._stream import Handle, TokenStream
from ._types import FinishReason, GenerationRequest
from ._worker import Worker

log = logging.getLogger("mlx_nursery.engine")

THREAD_NAME = "mlx-nursery-engine"
State = Literal["starting", "running", "stopping", "closed", "failed"]


@attrs.frozen
class EngineStatistics:
    state: State
    lanes_total: int
    lanes_borrowed: int
    queued: int
    worker: WorkerStats | None
    late_events: int
    """Events that arrived for a sequence already confirmed gone: always 0 unless a bug."""
    cancellations: CancelStatistics
    """Cancel-to-confirmation latencies and steps in flight, for every cancelled sequence."""


class Engine:
    """Runs one model on one engine thread.

    Start it with `open_engine` or `nursery.start(engine.run)`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._state: State = "starting"
        self._ids = itertools.count()
        self._handles: dict[int, Handle] = {}
        self._waiting: set[trio.CancelScope] = set()
        self._stats: WorkerStats | None = None
        self._model: ModelInfo | None = None
        self._limiter: FairLanes | None = None
        self._worker: Worker | None = None
        self._stop_requested = False
        self._late_events = 0
        self._cancellations = CancelRecorder()
        self.ended = trio.Event()
        """Set once `run` is over: the thread has exited (closed, or dead) and been joined."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the engine thread, load the model, and serve until `close()` or cancellation.

        Returns only after the engine thread has exited and been joined. A model
        that fails to load raises; a fatal error later does not (it would take
        the caller's nursery down): the engine reports itself unhealthy instead.
        """
        token = trio.lowlevel.current_trio_token()
        self._limiter = FairLanes(self.config.max_concurrency)
        ready, exited = trio.Event(), trio.Event()
        outcome: dict[str, BaseException | None] = {"load": None, "exit": None}

        def on_ready(info: ModelInfo | None, exc: BaseException | None) -> None:
            def apply() -> None:
                self._model, outcome["load"] = info, exc
                ready.set()

            _call_soon(token, _logging_failures(apply))

        def on_exit(exc: BaseException | None) -> None:
            def apply() -> None:
                outcome["exit"] = exc
                self._on_exit(exc)
                exited.set()

            _call_soon(token, _logging_failures(apply))

        deliver = _logging_failures(self._deliver)
        self._worker = Worker(
            self.config, functools.partial(_call_soon, token, deliver), on_ready, on_exit
        )
        thread = threading.Thread(target=self._worker.run, name=THREAD_NAME, daemon=True)
        thread.start()
        try:
            await ready.wait()
            if outcome["load"] is not None:
                raise outcome["load"]
            _freeze_startup_heap()
            if self._stop_requested:
                self._worker.stop()
            else:
                self._state = "running"
            task_status.started(self)
            await exited.wait()
        finally:
            with trio.CancelScope(shield=True):
                self._worker.stop()
                await exited.wait()
            thread.join()
            gc.unfreeze()  # the model may now be collected, cycles included
            self.ended.set()

    def close(self) -> None:
        """Begin shutdown: refuse new work; the thread ends its step, cancels the rest, exits."""
        self._stop_requested = True
        if self._state in ("running", "starting"):
            if self._state == "running":
                self._state = "stopping"
            if self._worker is not None:
                self._worker.stop()
            self._wake_waiters()

    def _on_exit(self, exc: BaseException | None) -> None:
        self._state = "failed" if exc is not None else "closed"
        self._wake_waiters()
        # Sequences the thread did not finish (it died, or they raced its exit) end here.
        for handle in list(self._handles.values()):
            reason: FinishReason = "error" if exc is not None else "cancelled"
            self._push(handle, StepEvent(None, None, reason, None, "the engine stopped"))
            self._confirm(handle)

    def _wake_waiters(self) -> None:
        for scope in self._waiting:
            scope.cancel()

    # -- public surface ----------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self._state == "running"

    @property
    def model(self) -> ModelInfo:
        if self._model is None:
            raise EngineUnavailable("the engine has not loaded its model")
        return self._model

    @property
    def limiter(self) -> FairLanes:
        assert self._limiter is not None, "the engine is not started"
        return self._limiter

    def statistics(self) -> EngineStatistics:
        limiter = self._limiter
        return EngineStatistics(
            state=self._state,
            lanes_total=int(limiter.total_tokens) if limiter else self.config.max_concurrency,
            lanes_borrowed=limiter.borrowed_tokens if limiter else 0,
            queued=limiter.statistics().tasks_waiting if limiter else 0,
            worker=self._stats,
            late_events=self._late_events,
            cancellations=self._cancellations.snapshot(),
        )

    @asynccontextmanager
    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenStream]:
        """Generate one sequence; iterate the yielded stream for its events.

        Raises EngineOverloaded at once when the wait queue is full, PromptTooLong
        when it cannot fit the context, EngineUnavailable when the engine is not
        running. Waiting for a lane is FIFO and cancellable at no compute cost.
        """
        self._check_admissible(request)
        handle = self._new_handle(request)
        await self._acquire_lane(handle)
        # From here the lane belongs to the sequence; only the engine's confirmation returns it.
        self._handles[handle.seq_id] = handle
        assert self._worker is not None
        self._worker.submit(handle.seq_id, request)
        try:
            yield TokenStream(handle, self)
        finally:
            if not handle.confirmed.is_set():
                self.cancel(handle)
                with trio.move_on_after(self.config.cancel_ack_timeout, shield=True):
                    await handle.confirmed.wait()
                if handle.confirmed.is_set():
                    self.confirmation_seen()
                else:
                    log.error("sequence %d not confirmed stopped in time", handle.seq_id)
            handle.receive.close()

    def cancel(self, handle: Handle) -> None:
        """Ask the engine thread to end `handle`'s sequence before its next step (once; a
        no-op once confirmed). The confirmation's latency is recorded in `_deliver`."""
        if handle.confirmed.is_set() or handle.cancel_requested_at is not None:
            return
        assert self._worker is not None
        handle.cancel_requested_step = self._worker.steps
        handle.cancel_requested_at = trio.current_time()
        self._worker.cancel(handle.seq_id)

    def confirmation_seen(self) -> None:
        if self._worker is not None:
            self._worker.confirmation_seen()

    def _check_admissible(self, request: GenerationRequest) -> None:
        if self._state != "running":
            raise EngineUnavailable(f"the engine is {self._state}")
        context = self.model.context_length
        if len(request.prompt_tokens) + request.max_tokens > context:
            raise PromptTooLong(len(request.prompt_tokens), request.max_tokens, context)
        limiter = self.limiter
        waiting = limiter.statistics().tasks_waiting
        if limiter.available_tokens == 0 and waiting >= self.config.max_queue:
            raise EngineOverloaded(waiting, self.config.max_queue)
        tenant, share = request.tenant, self.config.tenant_queue_share
        queued = limiter.waiting_for(tenant) if tenant is not None else 0
        if limiter.available_tokens == 0 and queued >= share:  # room left for other tenants
            raise EngineOverloaded(queued, share)

    def _new_handle(self, request: GenerationRequest) -> Handle:
        send, receive = trio.open_memory_channel[StepEvent](self.config.max_buffered_events)
        detokenizer = self.model.texts.detokenizer(trim_space=request.trim_leading_space)
        return Handle(next(self._ids), request, send, receive, detokenizer)

    async def _acquire_lane(self, handle: Handle) -> None:
        with trio.CancelScope() as waiting:
            self._waiting.add(waiting)
            try:
                await self.limiter.acquire_on_behalf_of(handle, handle.request.tenant)
            finally:
                self._waiting.discard(waiting)
        if waiting.cancelled_caught or self._state != "running":
            if not waiting.cancelled_caught:
                self.limiter.release_on_behalf_of(handle)
            raise EngineUnavailable(f"the engine is {self._state}")

    # -- delivery (runs in the Trio thread, scheduled by the engine thread) ------------------
    def _deliver(self, delivery: Delivery) -> None:
        self._stats = delivery.stats
        if delivery.closing is not None:
            # Before any lane is released: a waiter woken by it must see the engine is gone.
            self._state = delivery.closing
            self._wake_waiters()
        for seq_id, step in delivery.events:
            handle = self._handles.get(seq_id)
            if handle is not None:
                self._push(handle, step)
            else:
                self._late_events += 1
        for seq_id in delivery.finished:
            handle = self._handles.get(seq_id)
            if handle is not None:
                handle.confirmed_step = delivery.stats.steps
                if handle.cancel_requested_at is not None:
                    self._cancellations.record(
                        trio.current_time() - handle.cancel_requested_at,
                        handle.confirmed_step - (handle.cancel_requested_step or 0),
                    )
                self._confirm(handle)

    def _push(self, handle: Handle, event: StepEvent) -> None:
        if handle.stalled:
            return
        try:
            handle.send.send_nowait(event)
        except trio.WouldBlock:
            # The consumer stopped reading: cancel it rather than buffer without bound.
            handle.stalled = True
            if self._worker is not None:
                self.cancel(handle)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the consumer is gone; its confirmation still arrives

    def _confirm(self, handle: Handle) -> None:
        if handle.confirmed.is_set():
            return
        self._handles.pop(handle.seq_id, None)
        handle.send.close()
        if self._limiter is not None:
            self._limiter.release_on_behalf_of(handle)
        handle.confirmed.set()


def _freeze_startup_heap() -> None:
    """Take what exists once the model is loaded (modules, model, tokenizer) out of the
    cyclic collector's passes: none of it becomes garbage while the engine runs, and a full
    pass over it holds the GIL, which both threads need, in the middle of a step. On the dev
    machine one such pass took 57 ms and made the slowest cancellation of a benchmark run
    (bench/engine.py, cancel diagnostics). Objects made later are collected as usual;
    collecting first matters, since frozen garbage is never freed. vLLM freezes its heap
    after startup for the same reason (vllm/utils/gc_utils.py)."""
    gc.collect()
    gc.freeze()


def _logging_failures(fn: Callable[..., None]) -> Callable[..., None]:
    """`fn`, for the Trio thread's run_sync_soon: an exception there would end the Trio run."""

    def guarded(*args: object) -> None:
        try:
            fn(*args)
        except Exception:  # a failed delivery must not end the Trio run
            log.exception("engine delivery failed")

    return guarded


def _call_soon(token: trio.lowlevel.TrioToken, fn: Callable[..., None], *args: object) -> None:
    """Schedule `fn(*args)` on the Trio thread, from the engine thread. The engine binds its
    delivery callable once (a partial of this), not per post: on a lone stream a post runs
    once per token on the thread that stream is bound by."""
    with suppress(trio.RunFinishedError):
        token.run_sync_soon(fn, *args)


@asynccontextmanager
async def open_engine(config: EngineConfig) -> AsyncIterator[Engine]:
    """Run an engine for the duration of the block; on exit its thread is stopped and joined."""
    async with trio.open_nursery() as nursery:
        engine: Engine = await nursery.start(Engine(config).run)
        try:
            yield engine
        finally:
            engine.close()
