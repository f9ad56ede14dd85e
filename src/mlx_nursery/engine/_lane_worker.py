"""The thread side of a one-lane device thread (speech-to-text, speech synthesis).

Both speech engines' threads load one model and run its jobs one at a time; what they share
is written here once (`LaneJobs` is the Trio side). Jobs arrive on a thread-safe queue
(None: stop), each with its stop flag, which the Trio side sets and the job's work checks
between its pieces (`LaneJob.check` raises `Stopped`). Everything leaves through one
`post`: a `LanePost` with the job's event (a piece, its result, or its failure), whether it
ended (its confirmation: it computes nothing more), and the thread's counters as they are
then. Every job gets exactly one confirmation: run, stopped, failed, or left queued behind
the stop. The counters are the thread's alone; the Trio side knows them only from posts.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import attrs

from .. import fault_points
from ..fault_points import Point, request_label
from ._device_thread import run_device_thread
from ._errors import EngineUnavailable

log = logging.getLogger("mlx_nursery.engine")

RequestT = TypeVar("RequestT")
InfoT = TypeVar("InfoT")
ModelT = TypeVar("ModelT")
NewsT = TypeVar("NewsT")
"""What a job's work posts: its pieces and its result (its failure is `EngineUnavailable`)."""
CountersT = TypeVar("CountersT")


class Stopped(Exception):
    """A job's stop flag was set: its work ends at the check that saw it."""


@attrs.frozen
class LanePost(Generic[NewsT, CountersT]):
    """One hop to Trio: a job's news, with the thread's counters."""

    job_id: int
    counters: CountersT
    event: NewsT | EngineUnavailable | None = None
    ended: bool = False
    """The job's confirmation: it computes nothing more (its last post)."""


@attrs.frozen(eq=False)
class LaneJob(Generic[RequestT]):
    job_id: int
    request: RequestT
    stop: threading.Event
    label: str | None
    """The request's label (its HTTP request id), for the fault seam (`fault_points`)."""

    def check(self, fault_point: Point) -> None:
        """Between two pieces of the work: raises `Stopped` once the stop flag is set;
        reaches `fault_point` where faults are armed."""
        if self.stop.is_set():
            raise Stopped
        if fault_points.ARMED:
            fault_points.reach(fault_point, self.label)


class LaneWorker(Generic[RequestT, InfoT, ModelT, NewsT, CountersT]):
    """Runs on its own thread (`run`); `submit` and `stop` are called from the Trio thread.

    A subclass says what its model and a job are: `_load`, `_work` (one job, raising
    `Stopped` where a check saw its flag) and `_counters`; `_send` posts a piece."""

    what = "engine"
    """The engine, as errors and the log name it ("speech engine")."""
    job_name = "job"
    """A job, as errors and the log name it ("transcription")."""

    def __init__(
        self,
        post: Callable[[LanePost[NewsT, CountersT]], None],
        on_ready: Callable[[InfoT | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        self._post = post
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._commands: queue.SimpleQueue[LaneJob[RequestT] | None] = queue.SimpleQueue()
        # This thread's alone; they reach Trio in posts only (`_counters`).
        self._running = False
        self._cancelled = 0

    # -- from the Trio thread -----------------------------------------------------------------
    def submit(self, job_id: int, request: RequestT, stop: threading.Event) -> None:
        self._commands.put(LaneJob(job_id, request, stop, request_label.get()))

    def stop(self) -> None:
        """Once the job running now (if any) ends, the thread exits."""
        self._commands.put(None)

    # -- the thread ---------------------------------------------------------------------------
    def run(self) -> None:
        run_device_thread(
            self.what, self._load, self._serve, self._finish, self._on_ready, self._on_exit
        )

    def _load(self) -> tuple[InfoT, ModelT]:
        """Load the model: what Trio is told of it, and the model the jobs run on."""
        raise NotImplementedError

    def _work(self, job: LaneJob[RequestT], model: ModelT) -> NewsT:
        """Run `job` on `model`, `_send` its pieces; return its result."""
        raise NotImplementedError

    def _counters(self) -> CountersT:
        """The thread's counters now (`_running` and `_cancelled` among them)."""
        raise NotImplementedError

    def _send(self, job_id: int, event: NewsT | EngineUnavailable | None, ended: bool) -> None:
        self._post(LanePost(job_id, self._counters(), event, ended))

    def _serve(self, model: ModelT) -> None:
        while (job := self._commands.get()) is not None:
            self._run_job(job, model)

    def _run_job(self, job: LaneJob[RequestT], model: ModelT) -> None:
        """Run one job; its events and its confirmation go to Trio, whatever happens."""
        outcome: NewsT | EngineUnavailable | None = None
        self._running = True
        self._send(job.job_id, None, ended=False)
        try:
            outcome = self._work(job, model)
        except Stopped:
            self._cancelled += 1
        except Exception:
            log.exception("a %s failed", self.job_name)
            outcome = EngineUnavailable(f"the {self.job_name} failed; the server's log says why")
        finally:
            self._running = False
            self._send(job.job_id, outcome, ended=True)

    def _finish(self, exc: BaseException | None) -> None:
        """Jobs queued behind the stop: confirmed, never run."""
        while True:
            try:
                left = self._commands.get_nowait()
            except queue.Empty:
                return
            if left is not None:
                self._send(left.job_id, EngineUnavailable(f"the {self.what} stopped"), ended=True)
