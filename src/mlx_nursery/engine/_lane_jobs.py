"""The Trio side of a one-lane device thread's jobs (speech-to-text, speech synthesis).

Both speech engines run one job at a time on their thread, and hand each job's events to
Trio the same way; what is written here once: a job borrows the lane before it is
submitted, its events go to a bounded channel, a consumer that stops reading gets its job
stopped (never an unbounded buffer), leaving the job's block sets its stop flag and waits
(shielded, bounded) for the thread's confirmation, and only that confirmation returns the
lane. The thread's posts (`deliver`) and its death (`fail_all`) are the only ways in.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import attrs
import trio

from ._device_thread import DeviceThread

RequestT = TypeVar("RequestT")
EventT = TypeVar("EventT")

Submit = Callable[[int, RequestT, threading.Event], None]
"""The worker's `submit(job_id, request, stop)`, called from the Trio thread."""


@attrs.define(eq=False)
class _Job(Generic[EventT]):
    """A job seen from Trio: its channel, its stop flag, its confirmation."""

    job_id: int
    send: trio.MemorySendChannel[EventT]
    stop: threading.Event = attrs.Factory(threading.Event)
    confirmed: trio.Event = attrs.Factory(trio.Event)


class LaneJobs(Generic[RequestT, EventT]):
    """The jobs of one device thread that runs them one lane at a time."""

    def __init__(self, device: DeviceThread[Any], max_buffered: int, what: str) -> None:
        self._device = device
        self._max_buffered = max_buffered
        self._what = what
        """A job, as the log names it ("transcription")."""
        self._ids = itertools.count()
        self._jobs: dict[int, _Job[EventT]] = {}

    @asynccontextmanager
    async def open(
        self, request: RequestT, submit: Submit[RequestT]
    ) -> AsyncIterator[trio.MemoryReceiveChannel[EventT]]:
        """Borrow the lane, submit `request`, and yield its events' channel.

        Raises `EngineOverloaded` when the lane is busy and the queue full,
        `EngineUnavailable` when the engine is not running (or stops while this waits).
        Cancellation: waiting for the lane is cancellable at no cost; leaving the block
        sets the job's stop flag and waits, shielded and bounded by the device's
        `cancel_ack_timeout`, for the thread's confirmation, which alone returns the lane."""
        device = self._device
        device.check_running()
        device.check_queue()
        send, receive = trio.open_memory_channel[EventT](self._max_buffered)
        job = _Job(next(self._ids), send)
        await device.acquire_lane(job)
        # From here the lane belongs to the job; only the thread's word returns it.
        self._jobs[job.job_id] = job
        submit(job.job_id, request, job.stop)
        try:
            async with receive:
                yield receive
        finally:
            job.stop.set()
            await device.wait_confirmed(job.confirmed, f"{self._what} {job.job_id}")

    def deliver(self, job_id: int, event: EventT | None, ended: bool) -> None:
        """A post from the thread: `job_id`'s event, and whether the job ended (computes
        nothing more). Trio thread."""
        job = self._jobs.get(job_id)
        if job is None:
            return
        if event is not None:
            self._push(job, event)
        if ended:
            self._confirm(job)

    def fail_all(self, event: EventT) -> None:
        """The thread died under its jobs: each gets `event` and its confirmation."""
        for job in list(self._jobs.values()):
            self._push(job, event)
            self._confirm(job)

    def _push(self, job: _Job[EventT], event: EventT) -> None:
        try:
            job.send.send_nowait(event)
        except trio.WouldBlock:
            job.stop.set()  # the consumer stopped reading: stop rather than buffer
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the consumer is gone; its confirmation still arrives

    def _confirm(self, job: _Job[EventT]) -> None:
        del self._jobs[job.job_id]
        job.send.close()
        self._device.release_lane(job)
        job.confirmed.set()
