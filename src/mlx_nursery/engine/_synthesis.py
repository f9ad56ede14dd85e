"""The speech-synthesis runtime: a TTS model on a thread of its own, one synthesis at a time.

A TTS model (KittenTTS, Kokoro) makes audio a sentence at a time through its own generator;
it does not go through the text engine's batch. It is a `LaneEngine` (`_lane_engine.py`,
shared with the speech-to-text engine): one thread (`mlx-nursery-synthesis`,
`SynthesisWorker`) makes every MLX call on the model (load, and every piece of audio), one
lane, a bounded queue, a stop flag the thread checks before each sentence and each piece
the model yields, so a cancel stops the compute within one piece. Chunks cross to Trio
once per piece.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import attrs
import trio

from ._lane_engine import LaneEngine
from ._synthesis_types import (
    AudioChunk,
    SynthesisModelInfo,
    SynthesisRequest,
    SynthesisStatistics,
    Synthesized,
)
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


class SynthesisEngine(
    LaneEngine[SynthesisRequest, SynthesisModelInfo, AudioChunk | Synthesized, SynthesisCounters]
):
    """A TTS model served from its own thread. Start it with `nursery.start(engine.run)`;
    `run` returns once the thread is joined (cancelled: within one piece)."""

    def __init__(self, config: SynthesisConfig) -> None:
        super().__init__(
            SYNTHESIS_THREAD_NAME,
            "synthesis engine",
            "synthesis",
            max_queue=config.max_queue,
            cancel_ack_timeout=config.cancel_ack_timeout,
            max_buffered=config.max_buffered_chunks,
            counters=SynthesisCounters(),
        )
        self.config = config

    def _start_worker(
        self,
        post: Callable[[SynthesisPost], None],
        on_ready: Callable[[SynthesisModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> SynthesisWorker:
        return SynthesisWorker(self.config.model, post, on_ready, on_exit)

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

    def synthesize(
        self, request: SynthesisRequest
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[SynthesisEvent]]:
        """Synthesize `request`; the block reads its events: an `AudioChunk` per piece the
        model made, in order, then `Synthesized` (or an `EngineUnavailable` when it failed).

        Raises `EngineOverloaded` when the lane is busy and `max_queue` syntheses already
        wait, `EngineUnavailable` when the engine is not running (or stops while this one
        waits for the lane).

        Cancellation: waiting for the lane is cancellable at no cost. Leaving the block
        early (a cancelled scope, a `break`) stops the synthesis within one piece: the
        block's exit waits, shielded and bounded by `cancel_ack_timeout`, for the thread's
        confirmation, and the lane returns with that confirmation only."""
        return self._open(request)
