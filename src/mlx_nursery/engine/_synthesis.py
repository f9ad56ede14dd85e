"""The speech-synthesis runtime: a TTS model on a thread of its own, one synthesis at a time.

A TTS model (KittenTTS, Kokoro) makes audio a sentence at a time through its own generator;
it does not go through the text engine's batch. It keeps the rules of the speech-to-text
engine (`_speech.py`), which it mirrors, and shares their lifecycle (`DeviceThread`):

- One thread (`mlx-nursery-synthesis`, `SynthesisWorker`), started and joined by
  `SynthesisEngine.run`, makes every MLX call on the model: load, and every piece of audio.
- One lane (`FairLanes(1)`, FIFO and cancellable), borrowed before a synthesis is handed
  to the thread and returned by the thread's confirmation that it ended, never by the
  caller. In front of it a bounded queue (`max_queue`): past it, `EngineOverloaded` at once.
- Cancellation is cooperative: leaving `synthesize`'s block sets the synthesis's stop
  flag; the thread checks it before each sentence and each piece the model yields, so the
  compute stops within one piece, and confirms. The caller waits for the confirmation
  shielded, bounded by `cancel_ack_timeout`.
- Chunks cross to Trio once per piece (`run_sync_soon`) into a bounded channel; a consumer
  that stops reading is stopped rather than buffered without bound (the lane, the channel
  and the confirmation are `LaneJobs`, shared with the speech engine). The thread's counters
  come with every post; nothing is written across threads.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from ._device_thread import DeviceThread
from ._errors import EngineUnavailable
from ._lane_jobs import LaneJobs
from ._lanes import FairLanes
from ._synthesis_types import SynthesisModelInfo, SynthesisRequest, SynthesisStatistics
from ._synthesis_worker import SynthesisCounters, SynthesisEvent, SynthesisPost, SynthesisWorker

__all__ = ["SYNTHESIS_THREAD_NAME", "SynthesisConfig", "SynthesisEngine", "SynthesisEvent"]

SYNTHESIS_THREAD_NAME = "mlx-nursery-synthesis"


@attrs.frozen
class SynthesisConfig:
    model: Path
    max_queue: int = 64
    """Syntheses that may wait for the lane; past it, `EngineOverloaded`."""
    cancel_ack_timeout: float = 30.0
    max_buffered_chunks: int = 64


class SynthesisEngine:
    """A TTS model served from its own thread. Start it with `nursery.start(engine.run)`."""

    def __init__(self, config: SynthesisConfig) -> None:
        self.config = config
        self._device = DeviceThread[SynthesisModelInfo](
            SYNTHESIS_THREAD_NAME,
            lanes=1,
            max_queue=config.max_queue,
            cancel_ack_timeout=config.cancel_ack_timeout,
            what="synthesis engine",
        )
        self._jobs = LaneJobs[SynthesisRequest, SynthesisEvent](
            self._device, config.max_buffered_chunks, "synthesis"
        )
        self._worker: SynthesisWorker | None = None
        self._counters = SynthesisCounters()
        """The thread's counters, as of its last post."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(
        self, *, task_status: trio.TaskStatus[SynthesisEngine] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the synthesis thread, load the model on it, serve until `close()`.

        Raises what the load raised. Returns only once the thread has ended and been
        joined; cancelled, it stops the thread first (shielded: within one piece)."""
        device = self._device
        self._worker = SynthesisWorker(
            self.config.model, device.bind(self._deliver), device.report_ready, device.report_exit
        )
        await device.run(
            self._worker, started=lambda: task_status.started(self), on_exit=self._on_exit
        )

    def close(self) -> None:
        """Refuse new work: syntheses waiting for the lane get `EngineUnavailable` at once;
        the thread finishes (or stops) its synthesis and exits. Not a checkpoint."""
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
    def info(self) -> SynthesisModelInfo:
        return self._device.loaded()

    @property
    def limiter(self) -> FairLanes:
        return self._device.lanes

    def statistics(self) -> SynthesisStatistics:
        lanes, counters = self._device.lanes, self._counters
        return SynthesisStatistics(
            state=self._device.state,
            lanes_borrowed=lanes.borrowed_tokens,
            queued=lanes.statistics().tasks_waiting,
            running=counters.running,
            chunks_synthesized=counters.chunks,
            samples_synthesized=counters.samples,
            cancelled=counters.cancelled,
        )

    @asynccontextmanager
    async def synthesize(
        self, request: SynthesisRequest
    ) -> AsyncIterator[trio.MemoryReceiveChannel[SynthesisEvent]]:
        """Synthesize `request`; the block reads its events: an `AudioChunk` per piece the
        model made, in order, then `Synthesized` (or an `EngineUnavailable` when it failed).

        Raises `EngineOverloaded` when the lane is busy and `max_queue` syntheses already
        wait, `EngineUnavailable` when the engine is not running (or stops while this one
        waits for the lane).

        Cancellation: waiting for the lane is cancellable at no cost. Leaving the block
        early (a cancelled scope, a `break`) stops the synthesis within one piece: the
        block's exit waits, shielded and bounded by `cancel_ack_timeout`, for the thread's
        confirmation, and the lane returns with that confirmation only."""
        async with self._jobs.open(request, self._submit) as events:
            yield events

    def _submit(self, job_id: int, request: SynthesisRequest, stop: threading.Event) -> None:
        assert self._worker is not None  # the lane is only lent while the engine runs
        self._worker.submit(job_id, request, stop)

    # -- the Trio side of the thread's posts ---------------------------------------------------
    def _deliver(self, post: SynthesisPost) -> None:
        self._counters = post.counters
        self._jobs.deliver(post.job_id, post.event, post.ended)

    def _on_exit(self, exc: BaseException | None) -> None:
        self._jobs.fail_all(EngineUnavailable("the synthesis engine stopped"))  # died under them
