"""A model on a thread of its own, one job at a time: what the speech-to-text and the speech
synthesis engines share, seen from Trio.

Neither model goes through the text engine's batch; both keep its rules, on the lifecycle
every engine shares (`DeviceThread`):

- One thread (a `LaneWorker`, `_lane_worker.py`), started and joined by `run`, makes every
  MLX call on the model. Jobs never overlap.
- One lane (`FairLanes(1)`, FIFO and cancellable), borrowed before a job is handed to the
  thread and returned by the thread's confirmation that it ended, never by the caller:
  `lanes_borrowed` is what may still compute. In front of it a bounded queue (`max_queue`):
  past it, `EngineOverloaded` at once. `close()` wakes the waiters at once.
- Cancellation is cooperative: leaving a job's block sets its stop flag; the thread checks
  it between the pieces of the work, so the compute stops within one piece, and confirms.
  The caller waits for the confirmation shielded, bounded by `cancel_ack_timeout`.
- Events cross to Trio once per piece (`run_sync_soon`) into a bounded channel; a consumer
  that stops reading is stopped rather than buffered without bound (`LaneJobs`). The
  thread's counters come with every post; nothing is written across threads.

A subclass (`SpeechEngine`, `SynthesisEngine`) names its thread, starts its worker, and
gives its jobs and statistics their public names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Generic, Protocol, Self, TypeVar

import trio

from ._device_thread import DeviceThread, ThreadBody
from ._errors import EngineUnavailable
from ._lane_jobs import LaneJobs
from ._lane_worker import LanePost
from ._lanes import FairLanes

RequestT = TypeVar("RequestT")
RequestT_contra = TypeVar("RequestT_contra", contravariant=True)
InfoT = TypeVar("InfoT")
NewsT = TypeVar("NewsT")
CountersT = TypeVar("CountersT")


class JobThread(ThreadBody, Protocol[RequestT_contra]):
    """A one-lane engine's thread body: it also takes jobs (`LaneWorker.submit`)."""

    def submit(self, job_id: int, request: RequestT_contra, stop: threading.Event) -> None: ...


class LaneEngine(Generic[RequestT, InfoT, NewsT, CountersT]):
    """A model served from its own thread, a job at a time. Start it with
    `nursery.start(engine.run)`."""

    def __init__(
        self,
        thread_name: str,
        what: str,
        job_name: str,
        *,
        max_queue: int,
        cancel_ack_timeout: float,
        max_buffered: int,
        counters: CountersT,
    ) -> None:
        self._device = DeviceThread[InfoT](
            thread_name,
            lanes=1,
            max_queue=max_queue,
            cancel_ack_timeout=cancel_ack_timeout,
            what=what,
        )
        self._jobs = LaneJobs[RequestT, NewsT | EngineUnavailable](
            self._device, max_buffered, job_name
        )
        self._worker: JobThread[RequestT] | None = None
        self._counters = counters
        """The thread's counters, as of its last post."""

    def _start_worker(
        self,
        post: Callable[[LanePost[NewsT, CountersT]], None],
        on_ready: Callable[[InfoT | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> JobThread[RequestT]:
        """The subclass's worker, reporting through these."""
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Self] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the thread, load the model on it, serve until `close()`.

        Raises what the load raised. Returns only once the thread has ended and been
        joined; cancelled, it stops the thread first (shielded: within one piece)."""
        device = self._device
        self._worker = self._start_worker(
            device.bind(self._deliver), device.report_ready, device.report_exit
        )
        await device.run(
            self._worker, started=lambda: task_status.started(self), on_exit=self._on_exit
        )

    def close(self) -> None:
        """Refuse new work: jobs waiting for the lane get `EngineUnavailable` at once; the
        thread finishes (or stops) its job and exits. Not a checkpoint."""
        self._device.close()

    @property
    def ended(self) -> trio.Event:
        """Set once `run` is over: the thread has exited (closed, or dead) and been joined."""
        return self._device.ended

    # -- public surface ----------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self._device.healthy

    @property
    def info(self) -> InfoT:
        return self._device.loaded()

    @property
    def limiter(self) -> FairLanes:
        return self._device.lanes

    def _open(
        self, request: RequestT
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[NewsT | EngineUnavailable]]:
        """`LaneJobs.open` for `request`, on this engine's thread (its raises and its
        cancellation are the subclass's public method's)."""
        return self._jobs.open(request, self._submit)

    def _submit(self, job_id: int, request: RequestT, stop: threading.Event) -> None:
        assert self._worker is not None  # the lane is only lent while the engine runs
        self._worker.submit(job_id, request, stop)

    # -- the Trio side of the thread's posts ---------------------------------------------------
    def _deliver(self, post: LanePost[NewsT, CountersT]) -> None:
        self._counters = post.counters
        self._jobs.deliver(post.job_id, post.event, post.ended)

    def _on_exit(self, exc: BaseException | None) -> None:
        stopped = EngineUnavailable(f"the {self._device.what} stopped")
        self._jobs.fail_all(stopped)  # it died under them
