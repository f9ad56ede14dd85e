"""The synthesis thread: it loads a TTS model and runs its syntheses, one at a time.

It knows nothing of Trio; it is the speech thread's twin (`_speech_worker.py`). Syntheses
arrive on a thread-safe queue (None: stop), each with its stop flag, which the Trio side
sets and this thread checks before each sentence and between the pieces the model's
generator yields (closing the generator: the model computes nothing more). Everything
leaves through one `post`: a `SynthesisPost` with the synthesis's event (a chunk, the end,
or its failure), whether it ended (its confirmation), and this thread's counters then.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import attrs

from .. import fault_points
from ..fault_points import request_label
from ..models import SynthesisModel
from ._device_thread import run_device_thread
from ._errors import EngineUnavailable
from ._synthesis_types import (
    AudioChunk,
    SynthesisModelInfo,
    SynthesisRequest,
    Synthesized,
    sentences,
)

log = logging.getLogger("mlx_nursery.engine")

SynthesisEvent = AudioChunk | Synthesized | EngineUnavailable
"""What a synthesis's channel carries: chunks, then `Synthesized` or an error."""


@attrs.frozen
class SynthesisCounters:
    """The synthesis thread's counters since it started, as of one post."""

    running: bool = False
    chunks: int = 0
    samples: int = 0
    cancelled: int = 0


@attrs.frozen
class SynthesisPost:
    """One hop to Trio: a synthesis's news, with the thread's counters."""

    job_id: int
    counters: SynthesisCounters
    event: SynthesisEvent | None = None
    ended: bool = False
    """The synthesis's confirmation: it computes nothing more (its last post)."""


@attrs.frozen(eq=False)
class _Synthesize:
    job_id: int
    request: SynthesisRequest
    stop: threading.Event
    label: str | None
    """The request's label (its HTTP request id), for the fault seam (`fault_points`)."""


class _Stopped(Exception):
    """The synthesis's stop flag was set: it ends between two pieces."""


class SynthesisWorker:
    """Runs on its own thread (`run`); `submit` and `stop` are called from the Trio thread."""

    def __init__(
        self,
        model: Path,
        post: Callable[[SynthesisPost], None],
        on_ready: Callable[[SynthesisModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        self._model_path = model
        self._post = post
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._commands: queue.SimpleQueue[_Synthesize | None] = queue.SimpleQueue()
        # This thread's alone; they reach Trio in posts only (`_counters`).
        self._running = False
        self._chunks = 0
        self._samples = 0
        self._cancelled = 0

    # -- from the Trio thread -----------------------------------------------------------------
    def submit(self, job_id: int, request: SynthesisRequest, stop: threading.Event) -> None:
        self._commands.put(_Synthesize(job_id, request, stop, request_label.get()))

    def stop(self) -> None:
        """Once the synthesis running now (if any) ends, the thread exits."""
        self._commands.put(None)

    # -- the thread ---------------------------------------------------------------------------
    def run(self) -> None:
        run_device_thread(
            "synthesis engine", self._load, self._serve, self._finish, self._on_ready, self._on_exit
        )

    def _load(self) -> tuple[SynthesisModelInfo, SynthesisModel]:
        from ..models import load_synthesis_model

        model = load_synthesis_model(self._model_path)
        info = SynthesisModelInfo(
            str(model.path), model.model_type, model.sample_rate, model.voices
        )
        return info, model

    def _serve(self, model: SynthesisModel) -> None:
        while (job := self._commands.get()) is not None:
            self._synthesize(job, model)

    def _finish(self, exc: BaseException | None) -> None:
        """Syntheses queued behind the stop: confirmed, never run."""
        while True:
            try:
                left = self._commands.get_nowait()
            except queue.Empty:
                return
            if left is not None:
                stopped = EngineUnavailable("the synthesis engine stopped")
                self._post(SynthesisPost(left.job_id, self._counters(), stopped, ended=True))

    def _synthesize(self, job: _Synthesize, model: SynthesisModel) -> None:
        """Run one synthesis, a sentence at a time; its chunks and its confirmation go to
        Trio. A set stop flag ends it before the next sentence or piece."""

        def check() -> None:
            if job.stop.is_set():
                raise _Stopped
            if fault_points.ARMED:
                fault_points.reach("synthesis_chunk", job.label)

        request = job.request
        outcome: SynthesisEvent | None = None
        chunks = samples = tokens = 0
        self._running = True
        self._post(SynthesisPost(job.job_id, self._counters()))
        try:
            for sentence in sentences(request.text):
                check()
                pieces = model.synthesize(sentence, request.voice, request.speed)
                try:
                    for piece in pieces:
                        check()
                        size = len(piece.samples)
                        chunks, samples, tokens = chunks + 1, samples + size, tokens + piece.tokens
                        self._chunks, self._samples = self._chunks + 1, self._samples + size
                        chunk = AudioChunk(piece.samples, model.sample_rate, piece.tokens)
                        self._post(SynthesisPost(job.job_id, self._counters(), chunk))
                finally:
                    pieces.close()  # a stopped generator computes nothing more
            outcome = Synthesized(chunks, samples, tokens, model.sample_rate)
        except _Stopped:
            self._cancelled += 1
        except Exception:
            log.exception("a synthesis failed")
            outcome = EngineUnavailable("the synthesis failed; the server's log says why")
        finally:
            self._running = False
            self._post(SynthesisPost(job.job_id, self._counters(), outcome, ended=True))

    def _counters(self) -> SynthesisCounters:
        return SynthesisCounters(self._running, self._chunks, self._samples, self._cancelled)
