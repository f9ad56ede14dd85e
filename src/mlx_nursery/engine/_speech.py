"""The speech runtime: a Whisper on a thread of its own, one transcription at a time.

Whisper is not a text-generation model (an encoder per 30-second window, a short decode per
window), so it does not go through the text engine's batch. It keeps that engine's rules,
and shares its lifecycle (`DeviceThread`):

- One thread (`mlx-nursery-speech`, `SpeechWorker`), started and joined by
  `SpeechEngine.run`, makes every MLX call on the model: load, spectrogram, encoder,
  decoder. Transcriptions never overlap.
- One lane (`FairLanes(1)`, FIFO and cancellable), borrowed before a transcription is
  handed to the thread and returned by the thread's confirmation that it ended, never by
  the caller: `lanes_borrowed` is what may still compute. In front of it a bounded queue
  (`max_queue`): past it, `EngineOverloaded` at once. `close()` wakes the waiters at once.
- Cancellation is cooperative: leaving `transcribe`'s block sets the transcription's stop
  flag; the thread checks it before every window and every decoder step (`_whisper.py`),
  so the compute stops within one token, and confirms. The caller waits for the
  confirmation shielded, bounded by `cancel_ack_timeout`.
- Results cross to Trio once per window (`run_sync_soon`) into a bounded channel; a
  consumer that stops reading is stopped rather than buffered without bound (the lane,
  the channel and the confirmation are `LaneJobs`, shared with the synthesis engine). The thread's
  counters come with every post; nothing is written across threads.
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
from ._speech_types import SpeechModelInfo, SpeechStatistics, TranscriptionRequest
from ._speech_worker import SpeechCounters, SpeechEvent, SpeechPost, SpeechWorker

__all__ = ["SPEECH_THREAD_NAME", "SpeechConfig", "SpeechEngine", "SpeechEvent"]

SPEECH_THREAD_NAME = "mlx-nursery-speech"


@attrs.frozen
class SpeechConfig:
    model: Path
    max_queue: int = 64
    """Transcriptions that may wait for the lane; past it, `EngineOverloaded`."""
    cancel_ack_timeout: float = 30.0
    max_buffered_windows: int = 64


class SpeechEngine:
    """A Whisper served from its own thread. Start it with `nursery.start(engine.run)`."""

    def __init__(self, config: SpeechConfig) -> None:
        self.config = config
        self._device = DeviceThread[SpeechModelInfo](
            SPEECH_THREAD_NAME,
            lanes=1,
            max_queue=config.max_queue,
            cancel_ack_timeout=config.cancel_ack_timeout,
            what="speech engine",
        )
        self._jobs = LaneJobs[TranscriptionRequest, SpeechEvent](
            self._device, config.max_buffered_windows, "transcription"
        )
        self._worker: SpeechWorker | None = None
        self._counters = SpeechCounters()
        """The thread's counters, as of its last post."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(
        self, *, task_status: trio.TaskStatus[SpeechEngine] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the speech thread, load the model on it, serve until `close()`.

        Raises what the load raised. Returns only once the thread has ended and been
        joined; cancelled, it stops the thread first (shielded: within one token)."""
        device = self._device
        self._worker = SpeechWorker(
            self.config.model, device.bind(self._deliver), device.report_ready, device.report_exit
        )
        await device.run(
            self._worker, started=lambda: task_status.started(self), on_exit=self._on_exit
        )

    def close(self) -> None:
        """Refuse new work: transcriptions waiting for the lane get `EngineUnavailable` at
        once; the thread finishes (or stops) its transcription and exits. Not a checkpoint."""
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
    def info(self) -> SpeechModelInfo:
        return self._device.loaded()

    @property
    def limiter(self) -> FairLanes:
        return self._device.lanes

    def statistics(self) -> SpeechStatistics:
        lanes, counters = self._device.lanes, self._counters
        return SpeechStatistics(
            state=self._device.state,
            lanes_borrowed=lanes.borrowed_tokens,
            queued=lanes.statistics().tasks_waiting,
            running=counters.running,
            windows_decoded=counters.windows,
            tokens_decoded=counters.tokens,
            cancelled=counters.cancelled,
        )

    @asynccontextmanager
    async def transcribe(
        self, request: TranscriptionRequest
    ) -> AsyncIterator[trio.MemoryReceiveChannel[SpeechEvent]]:
        """Transcribe `request`; the block reads its events: a `Window` per 30-second window
        decoded, then the `Transcript` (or an `EngineUnavailable` when it failed).

        Raises `EngineOverloaded` when the lane is busy and `max_queue` transcriptions
        already wait, `EngineUnavailable` when the engine is not running (or stops while
        this one waits for the lane).

        Cancellation: waiting for the lane is cancellable at no cost. Leaving the block
        early (a cancelled scope, a `break`) stops the transcription within one decoder
        step: the block's exit waits, shielded and bounded by `cancel_ack_timeout`, for the
        thread's confirmation, and the lane returns with that confirmation only."""
        async with self._jobs.open(request, self._submit) as events:
            yield events

    def _submit(self, job_id: int, request: TranscriptionRequest, stop: threading.Event) -> None:
        assert self._worker is not None  # the lane is only lent while the engine runs
        self._worker.submit(job_id, request, stop)

    # -- the Trio side of the thread's posts ---------------------------------------------------
    def _deliver(self, post: SpeechPost) -> None:
        self._counters = post.counters
        self._jobs.deliver(post.job_id, post.event, post.ended)

    def _on_exit(self, exc: BaseException | None) -> None:
        self._jobs.fail_all(EngineUnavailable("the speech engine stopped"))  # died under them
