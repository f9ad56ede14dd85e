"""The embedding engine's Trio side: admission, lanes, delivery, cancellation.

An embedding model, or a cross-encoder (a reranker: the same encoders under a
classification head), runs on a thread of its own (`EmbeddingWorker`), as a generation model
does, and batches the inputs of the requests that are there together into one forward
(bounded in inputs and padded tokens). The thread's lifecycle, lanes (`FairLanes`, no
tenants), queue bound and posting are every engine's (`DeviceThread`): a request borrows a
lane before its inputs go to the thread, and the lane comes back only with the thread's
word that the request left it. Past `max_queue` requests waiting for a lane, a request is
refused at once.

Cancellation contract of `Embedder.embed`: when the caller's scope is cancelled (timeout,
disconnect, shutdown), the request's inputs not yet in a forward are dropped before the
next one, and `embed` waits, shielded and bounded, for the thread's confirmation; so when
it returns, nothing of the request computes.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import attrs
import numpy as np
import trio

from ._device_thread import DeviceThread
from ._embedding_worker import BatchLimits, EmbeddingModelInfo, EmbeddingWorker, Ended
from ._engine import EngineStatistics
from ._errors import EmbeddingFailed, EngineUnavailable
from ._lanes import FairLanes
from ._statistics import CancelRecorder

EMBEDDING_THREAD_NAME = "mlx-nursery-embedder"


@attrs.frozen
class EmbedderConfig:
    model: str | Path
    max_concurrency: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    """Requests on the engine at once (their inputs batched together)."""
    max_queue: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    """Requests allowed to wait for a lane; past this, `embed` fails at once."""
    max_batch_inputs: int = attrs.field(default=32, validator=attrs.validators.ge(1))
    max_batch_tokens: int = attrs.field(default=8192, validator=attrs.validators.ge(1))
    """Padded tokens in one forward (inputs times the longest of them)."""
    cancel_ack_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))


@attrs.frozen
class EmbeddingRequest:
    """Token ids of each input, and the size to cut each vector to (None: the model's).

    For a cross-encoder each input is a pair framed as one sequence, and `token_types` may
    give each one's token types (as long as its ids): what tells the pair's texts apart."""

    inputs: list[list[int]]
    dimensions: int | None = None
    token_types: list[list[int]] | None = None

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.inputs)


@attrs.define(eq=False)
class _Handle:
    request_id: int
    done: trio.Event = attrs.Factory(trio.Event)
    ended: Ended | None = None
    cancel_requested_at: float | None = None
    cancel_requested_forward: int = 0


class Embedder:
    """Runs one embedding model on one thread (its lifecycle, lanes and posting:
    `DeviceThread`). Start it with `nursery.start(embedder.run)`."""

    def __init__(self, config: EmbedderConfig) -> None:
        self.config = config
        self._device = DeviceThread[EmbeddingModelInfo](
            EMBEDDING_THREAD_NAME,
            lanes=config.max_concurrency,
            max_queue=config.max_queue,
            cancel_ack_timeout=config.cancel_ack_timeout,
        )
        self._ids = itertools.count()
        self._handles: dict[int, _Handle] = {}
        self._worker: EmbeddingWorker | None = None
        self._forwards = 0
        self._cancellations = CancelRecorder()

    async def run(
        self, *, task_status: trio.TaskStatus[Embedder] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the thread, load the model, serve until `close()` or cancellation.

        Returns only after the thread has ended and been joined. A model that fails to load
        raises; a failure later makes the engine unhealthy instead."""
        device = self._device
        self._worker = EmbeddingWorker(
            self.config.model,
            BatchLimits(self.config.max_batch_inputs, self.config.max_batch_tokens),
            device.bind(self._deliver),
            device.report_ready,
            device.report_exit,
        )
        await device.run(
            self._worker, started=lambda: task_status.started(self), on_exit=self._on_exit
        )

    def close(self) -> None:
        """Refuse new work; the thread ends its forward, drops the rest and exits. Not a
        checkpoint."""
        self._device.close()

    @property
    def ended(self) -> trio.Event:
        """Set once `run` is over: the thread has exited (closed, or dead) and been joined."""
        return self._device.ended

    @property
    def healthy(self) -> bool:
        return self._device.healthy

    @property
    def model(self) -> EmbeddingModelInfo:
        return self._device.loaded()

    @property
    def limiter(self) -> FairLanes:
        return self._device.lanes

    @property
    def forwards(self) -> int:
        """Forwards run since the engine started (one batch of inputs each), as last posted."""
        return self._forwards

    def statistics(self) -> EngineStatistics:
        """What a generation engine's statistics say of lanes, queue and cancellations (the
        metrics and `ServerReport` read both alike); no worker statistics."""
        lanes = self._device.lanes
        return EngineStatistics(
            state=self._device.state,
            lanes_total=lanes.total_tokens,
            lanes_borrowed=lanes.borrowed_tokens,
            queued=lanes.statistics().tasks_waiting,
            worker=None,
            late_events=0,
            cancellations=self._cancellations.snapshot(),
        )

    async def embed(self, request: EmbeddingRequest) -> list[np.ndarray]:
        """The request's vectors (float32; a cross-encoder's: each input's logits), in input
        order.

        Raises EngineOverloaded at once when the wait queue is full, EngineUnavailable when
        the engine is not running (or stops first), EmbeddingFailed when a forward holding
        its inputs failed. Waiting for a lane is FIFO and cancellable at no compute cost;
        cancelled later, it returns once the thread confirms the request has left it
        (shielded, bounded by `cancel_ack_timeout`), and `Cancelled` propagates."""
        self._device.check_running()
        self._device.check_queue()
        if not request.inputs:
            return []
        handle = _Handle(next(self._ids))
        await self._device.acquire_lane(handle)
        # From here the lane belongs to the request; only the thread's word returns it.
        self._handles[handle.request_id] = handle
        assert self._worker is not None
        self._worker.submit(
            handle.request_id, request.inputs, request.dimensions, request.token_types
        )
        try:
            await handle.done.wait()
        finally:
            if not handle.done.is_set():
                handle.cancel_requested_at = trio.current_time()
                handle.cancel_requested_forward = self._forwards
                self._worker.cancel(handle.request_id)
                await self._device.wait_confirmed(
                    handle.done, f"embedding request {handle.request_id}"
                )
        ended = handle.ended
        if ended is None or ended.vectors is None:
            if ended is not None and ended.failed:
                raise EmbeddingFailed("the model failed on a batch holding this request")
            raise EngineUnavailable(f"the engine is {self._device.state}")
        return ended.vectors

    # -- on the Trio thread, posted by the engine thread ------------------------------------
    def _deliver(self, ended: list[Ended], forwards: int) -> None:
        self._forwards = forwards
        for item in ended:
            handle = self._handles.pop(item.request_id, None)
            if handle is None:
                continue
            if handle.cancel_requested_at is not None:
                self._cancellations.record(
                    trio.current_time() - handle.cancel_requested_at,
                    forwards - handle.cancel_requested_forward,
                )
            self._release(handle, item)

    def _release(self, handle: _Handle, ended: Ended) -> None:
        handle.ended = ended
        self._device.release_lane(handle)
        handle.done.set()

    def _on_exit(self, exc: BaseException | None) -> None:
        for handle in list(self._handles.values()):  # raced the thread's exit
            self._handles.pop(handle.request_id, None)
            self._release(handle, Ended(handle.request_id))
