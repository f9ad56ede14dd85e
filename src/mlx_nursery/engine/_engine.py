"""The text engine's Trio side: admission, delivery, cancellation.

Its thread's lifecycle, lanes, queue bound and posting are every engine's (`DeviceThread`).
Lanes are `FairLanes` (a capacity limiter ordered by priority, fair among tenants): a
request borrows a token (cancellable) before its sequence is submitted, and the token is
returned by the engine thread's confirmation that the sequence left the batch, never
earlier. So `limiter.borrowed_tokens` is exactly the number of sequences that
may still be computing. A sequence the lanes ask to yield for a better priority gives its
token up the same way: once the thread confirms it is off the device (`suspended`); it then
waits for a token again, and is resumed when it has one.

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
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from ._adapters import AdapterBusy, AdapterChange, AdaptersDisabled, UnknownAdapter
from ._config import EngineConfig
from ._device_thread import DeviceThread, State
from ._errors import EngineUnavailable, PromptTooLong
from ._lanes import FairLanes
from ._messages import Delivery, ModelInfo, Resume, StepEvent, Suspend, WorkerStats
from ._priority import WaitStatistics
from ._scripted import request_detokenizer
from ._statistics import CancelRecorder, CancelStatistics
from ._stream import Handle, TokenStream
from ._types import FinishReason, GenerationRequest
from ._worker import Worker

THREAD_NAME = "mlx-nursery-engine"

_EVENT_MARGIN = 8
"""Events a request's buffer holds beyond its `max_tokens`: its final event, and room for
any other the engine adds."""


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
    suspended: int = 0
    """Sequences taken off the device for a better priority, waiting for a lane again."""
    queue_waits: Mapping[int, WaitStatistics] = attrs.field(factory=dict)
    """Requests' waits for a lane, by priority (`FairLanes.waits`)."""


class Engine:
    """Runs one model on one engine thread (its lifecycle, lanes and posting: `DeviceThread`).

    Start it with `open_engine` or `nursery.start(engine.run)`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._device = DeviceThread[ModelInfo](
            THREAD_NAME,
            lanes=config.max_concurrency,
            max_queue=config.max_queue,
            cancel_ack_timeout=config.cancel_ack_timeout,
            tenant_share=config.tenant_queue_share,
            priorities=config.priorities,
        )
        self._device.lanes.preempt = self._ask_to_yield
        self._ids = itertools.count()
        self._handles: dict[int, Handle] = {}
        self._stats: WorkerStats | None = None
        self._worker: Worker | None = None
        self._late_events = 0
        self._cancellations = CancelRecorder()
        self._adapters: dict[str, int] | None = None
        """The adapters loaded, by name: their bytes (None: before the load)."""
        self._adapter_users: Counter[str] = Counter()
        """Requests of each adapter from their admission check until their confirmation."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the engine thread, load the model, and serve until `close()` or cancellation.

        Returns only after the engine thread has exited and been joined. A model
        that fails to load raises; a fatal error later does not (it would take
        the caller's nursery down): the engine reports itself unhealthy instead.
        """
        device = self._device
        # The delivery is bound once: on a lone stream the thread posts once per token.
        self._worker = Worker(
            self.config, device.bind(self._deliver), device.report_ready, device.report_exit
        )

        def started() -> None:
            _freeze_startup_heap()
            task_status.started(self)

        try:
            await device.run(self._worker, started=started, on_exit=self._on_exit)
        finally:
            gc.unfreeze()  # the model may now be collected, cycles included

    def close(self) -> None:
        """Begin shutdown: refuse new work; the thread ends its step, cancels the rest, exits."""
        self._device.close()

    @property
    def ended(self) -> trio.Event:
        """Set once `run` is over: the thread has exited (closed, or dead) and been joined."""
        return self._device.ended

    def _on_exit(self, exc: BaseException | None) -> None:
        # Sequences the thread did not finish (it died, or they raced its exit) end here.
        for handle in list(self._handles.values()):
            reason: FinishReason = "error" if exc is not None else "cancelled"
            self._push(handle, StepEvent(None, None, reason, None, "the engine stopped"))
            self._confirm(handle)

    # -- public surface ----------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self._device.healthy and self.problem is None

    @property
    def problem(self) -> str | None:
        """Why a model served across devices cannot serve (its group failed), if it cannot."""
        distribution = self.config.distribution
        return None if distribution is None else distribution.failure

    def fail_all(self, detail: str) -> None:
        """End every request now with an error (`detail`), from outside the engine thread,
        which cannot: served across devices, it waits on a rank that stalled (the group's
        watchdog calls this, then exits the process). Lanes are returned at once."""
        for handle in list(self._handles.values()):
            self._push(handle, StepEvent(None, None, "error", None, detail))
            self._confirm(handle)

    @property
    def model(self) -> ModelInfo:
        return self._device.loaded()

    @property
    def limiter(self) -> FairLanes:
        return self._device.lanes

    def statistics(self) -> EngineStatistics:
        lanes = self._device.lanes
        waiting = lanes.statistics()
        return EngineStatistics(
            state=self._device.state,
            lanes_total=lanes.total_tokens,
            lanes_borrowed=lanes.borrowed_tokens,
            queued=waiting.tasks_waiting,
            worker=self._stats,
            late_events=self._late_events,
            cancellations=self._cancellations.snapshot(),
            suspended=waiting.suspended_waiting,
            queue_waits=lanes.waits(),
        )

    @asynccontextmanager
    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenStream]:
        """Generate one sequence; iterate the yielded stream for its events.

        Raises EngineOverloaded at once when the wait queue is full, PromptTooLong
        when it cannot fit the context, EngineUnavailable when the engine is not
        running. Waiting for a lane goes by priority (fairly among tenants within one) and
        is cancellable at no compute cost.
        """
        self.check_admission(request)
        adapter = request.adapter
        if adapter is not None:
            self._adapter_users[adapter] += 1  # no unload until its compute has stopped
        try:
            handle = self._new_handle(request)
            await self._device.acquire_lane(handle, request.tenant, request.priority)
            # From here the lane belongs to the sequence; only the engine's confirmation
            # returns it.
            self._handles[handle.seq_id] = handle
            assert self._worker is not None
            self._worker.submit(handle.seq_id, request)
            try:
                yield TokenStream(handle, self)
            finally:
                if not handle.confirmed.is_set():
                    self.cancel(handle)
                    if await self._device.wait_confirmed(
                        handle.confirmed, f"sequence {handle.seq_id}"
                    ):
                        self.confirmation_seen()
                handle.receive.close()
        finally:
            if adapter is not None:
                self._adapter_users[adapter] -= 1
                if not self._adapter_users[adapter]:
                    del self._adapter_users[adapter]

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

    def _ask_to_yield(self, borrower: object) -> None:
        """The lanes ask for `borrower`'s sequence to give up its lane for a better priority;
        the thread answers in a delivery (`suspended` or `kept`). Not a checkpoint."""
        assert isinstance(borrower, Handle) and self._worker is not None
        self._worker.send(Suspend(borrower.seq_id))

    def _resumer(self, handle: Handle) -> Callable[[], None]:
        worker = self._worker
        assert worker is not None
        return functools.partial(worker.send, Resume(handle.seq_id))

    def check_admission(self, request: GenerationRequest) -> None:
        """Raise what `generate` would refuse `request` with now, before it waits for a
        lane: EngineUnavailable, PromptTooLong, EngineOverloaded (the queue, or its tenant's
        share of it, is full). Not a checkpoint."""
        self._device.check_running()
        if request.adapter is not None and request.adapter not in self.adapters:
            raise UnknownAdapter(f"the adapter {request.adapter!r} is not loaded")
        context = self.model.context_length
        if len(request.prompt_tokens) + request.max_tokens > context:
            raise PromptTooLong(len(request.prompt_tokens), request.max_tokens, context)
        self._device.check_queue(request.tenant)

    # -- LoRA adapters -------------------------------------------------------------------------
    @property
    def adapters(self) -> dict[str, int]:
        """The LoRA adapters loaded now, by name: their bytes."""
        if self._adapters is None:
            self._adapters = dict(self.model.adapters)
        return self._adapters

    @property
    def adapters_in_use(self) -> frozenset[str]:
        """The adapters that requests admitted or running use (none of them may unload)."""
        return frozenset(self._adapter_users)

    async def load_adapter(self, name: str, path: Path) -> int:
        """Load the LoRA adapter at `path` as `name` on the engine thread, between steps;
        return its bytes. Raises AdaptersDisabled (adapters not enabled on this model),
        AdapterBusy (one of that name is loaded and in use), AdapterError (its files),
        EngineUnavailable.

        Cancellation: the load goes on once asked for (it is short: the adapter's files are
        read and its matrices set); a cancelled caller does not wait for it, and the adapter
        is then loaded or not as the engine thread ended it."""
        if not self.model.serves_adapters:
            raise AdaptersDisabled("adapters are not enabled on this model")
        if self._adapter_users[name]:
            raise AdapterBusy(f"the adapter {name!r} is in use")
        nbytes = await self._change_adapter(name, path)
        self.adapters[name] = nbytes
        return nbytes

    async def unload_adapter(self, name: str) -> None:
        """Unload the LoRA adapter `name`. Raises UnknownAdapter, AdapterBusy while a request
        of it is admitted or runs (nothing changes), EngineUnavailable. Cancellation: as
        `load_adapter`; requests for it are refused from the moment it is asked for."""
        if name not in self.adapters:
            raise UnknownAdapter(f"the adapter {name!r} is not loaded")
        if self._adapter_users[name]:
            raise AdapterBusy(f"the adapter {name!r} is in use; it was not unloaded")
        del self.adapters[name]
        await self._change_adapter(name, None)

    async def _change_adapter(self, name: str, path: Path | None) -> int:
        self._device.check_running()
        done = trio.Event()
        outcome: list[int | BaseException] = []

        def report(result: int | BaseException) -> None:
            outcome.append(result)
            done.set()

        assert self._worker is not None
        self._worker.change_adapter(AdapterChange(name, path, self._device.bind(report)))
        async with trio.open_nursery() as nursery:  # until it is done, or the engine ends

            async def watch(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch, done)
            nursery.start_soon(watch, self._device.ended)
        if not outcome:
            raise EngineUnavailable("the engine stopped")
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _new_handle(self, request: GenerationRequest) -> Handle:
        # Room for every event the request can produce (a token each, its end; a margin for
        # any other), up to the configured bound: a slow reader is never cut short of it.
        bound = min(self.config.max_buffered_events, request.max_tokens + _EVENT_MARGIN)
        send, receive = trio.open_memory_channel[StepEvent](bound)
        detokenizer = request_detokenizer(request, self.model.texts)
        return Handle(next(self._ids), request, send, receive, detokenizer)

    # -- delivery (runs in the Trio thread, scheduled by the engine thread) ------------------
    def _deliver(self, delivery: Delivery) -> None:
        self._stats = delivery.stats
        if delivery.closing is not None:
            # Before any lane is released: a waiter woken by it must see the engine is gone.
            self._device.ending(delivery.closing)
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
        lanes = self._device.lanes
        for seq_id in delivery.suspended:  # off the device: its lane may go to another
            handle = self._handles.get(seq_id)
            if handle is not None:
                lanes.suspended(handle, self._resumer(handle))
        for seq_id in delivery.kept:
            handle = self._handles.get(seq_id)
            if handle is not None:
                lanes.kept(handle)

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
        self._device.release_lane(handle)
        handle.confirmed.set()


def _freeze_startup_heap() -> None:
    """Take what exists once the model is loaded (modules, model, tokenizer) out of the
    cyclic collector's passes: none of it becomes garbage while the engine runs, and a full
    pass over it holds the GIL, which both threads need, in the middle of a step: such a pass
    made the slowest cancellation of a benchmark run (bench/engine.py, cancel diagnostics;
    docs/benchmarks.md, "Findings behind the current design"). Objects made later are
    collected as usual; collecting first matters, since frozen garbage is never freed. vLLM
    freezes its heap after startup for the same reason (vllm/utils/gc_utils.py)."""
    gc.collect()
    gc.freeze()


@asynccontextmanager
async def open_engine(config: EngineConfig) -> AsyncIterator[Engine]:
    """Run an engine for the duration of the block; on exit its thread is stopped and joined."""
    async with trio.open_nursery() as nursery:
        engine: Engine = await nursery.start(Engine(config).run)
        try:
            yield engine
        finally:
            engine.close()
