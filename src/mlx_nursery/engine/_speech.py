"""The speech runtime: a Whisper on a thread of its own, one transcription at a time.

Whisper is not a text-generation model (an encoder per 30-second window, a short decode per
window), so it does not go through the text engine's batch. It is a `LaneEngine`
(`_lane_engine.py`, shared with the synthesis engine): one thread (`mlx-nursery-speech`,
`SpeechWorker`) makes every MLX call on the model (load, spectrogram, encoder, decoder),
one lane, a bounded queue, a stop flag the thread checks before every window and every
decoder step (`_whisper.py`), so a cancel stops the compute within one token. Results
cross to Trio once per window.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import attrs
import trio

from ._lane_engine import LaneEngine
from ._speech_types import (
    SpeechModelInfo,
    SpeechStatistics,
    Transcript,
    TranscriptionRequest,
    Window,
)
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


class SpeechEngine(
    LaneEngine[TranscriptionRequest, SpeechModelInfo, Window | Transcript, SpeechCounters]
):
    """A Whisper served from its own thread. Start it with `nursery.start(engine.run)`;
    `run` returns once the thread is joined (cancelled: within one token)."""

    def __init__(self, config: SpeechConfig) -> None:
        super().__init__(
            SPEECH_THREAD_NAME,
            "speech engine",
            "transcription",
            max_queue=config.max_queue,
            cancel_ack_timeout=config.cancel_ack_timeout,
            max_buffered=config.max_buffered_windows,
            counters=SpeechCounters(),
        )
        self.config = config

    def _start_worker(
        self,
        post: Callable[[SpeechPost], None],
        on_ready: Callable[[SpeechModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> SpeechWorker:
        return SpeechWorker(self.config.model, post, on_ready, on_exit)

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

    def transcribe(
        self, request: TranscriptionRequest
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[SpeechEvent]]:
        """Transcribe `request`; the block reads its events: a `Window` per 30-second window
        decoded, then the `Transcript` (or an `EngineUnavailable` when it failed).

        Raises `EngineOverloaded` when the lane is busy and `max_queue` transcriptions
        already wait, `EngineUnavailable` when the engine is not running (or stops while
        this one waits for the lane).

        Cancellation: waiting for the lane is cancellable at no cost. Leaving the block
        early (a cancelled scope, a `break`) stops the transcription within one decoder
        step: the block's exit waits, shielded and bounded by `cancel_ack_timeout`, for the
        thread's confirmation, and the lane returns with that confirmation only."""
        return self._open(request)
