"""The speech thread: it loads a Whisper and runs its transcriptions, one at a time.

It knows nothing of Trio. Transcriptions arrive on a thread-safe queue (None: stop), each
with its stop flag, which the Trio side sets and the window loop checks (`_whisper.py`).
Everything leaves through one `post` (the engine's `DeviceThread.bind`): a `SpeechPost` with
the transcription's event (a window, its transcript or its failure), whether it ended (its
confirmation: it computes nothing more), and this thread's counters as they are then. The
counters are this thread's alone; the Trio side knows them only from the posts.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from .. import fault_points
from ..fault_points import request_label
from ._device_thread import run_device_thread
from ._errors import EngineUnavailable
from ._speech_types import SpeechModelInfo, Transcript, TranscriptionRequest, Window

log = logging.getLogger("mlx_nursery.engine")

SpeechEvent = Window | Transcript | EngineUnavailable
"""What a transcription's channel carries: windows, then a transcript or an error."""


@attrs.frozen
class SpeechCounters:
    """The speech thread's counters since it started, as of one post."""

    running: bool = False
    windows: int = 0
    tokens: int = 0
    cancelled: int = 0


@attrs.frozen
class SpeechPost:
    """One hop to Trio: a transcription's news, with the thread's counters."""

    job_id: int
    counters: SpeechCounters
    event: SpeechEvent | None = None
    ended: bool = False
    """The transcription's confirmation: it computes nothing more (its last post)."""


@attrs.frozen(eq=False)
class _Transcribe:
    job_id: int
    request: TranscriptionRequest
    stop: threading.Event
    label: str | None
    """The request's label (its HTTP request id), for the fault seam (`fault_points`)."""


class SpeechWorker:
    """Runs on its own thread (`run`); `submit` and `stop` are called from the Trio thread."""

    def __init__(
        self,
        model: Path,
        post: Callable[[SpeechPost], None],
        on_ready: Callable[[SpeechModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        self._model_path = model
        self._post = post
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._commands: queue.SimpleQueue[_Transcribe | None] = queue.SimpleQueue()
        # This thread's alone; they reach Trio in posts only (`_counters`).
        self._running = False
        self._windows = 0
        self._tokens = 0
        self._cancelled = 0

    # -- from the Trio thread -----------------------------------------------------------------
    def submit(self, job_id: int, request: TranscriptionRequest, stop: threading.Event) -> None:
        self._commands.put(_Transcribe(job_id, request, stop, request_label.get()))

    def stop(self) -> None:
        """Once the transcription running now (if any) ends, the thread exits."""
        self._commands.put(None)

    # -- the thread ---------------------------------------------------------------------------
    def run(self) -> None:
        run_device_thread(
            "speech engine", self._load, self._serve, self._finish, self._on_ready, self._on_exit
        )

    def _load(self) -> tuple[SpeechModelInfo, tuple[Any, ModuleType]]:
        from ..models import load_speech_model

        model = load_speech_model(self._model_path)
        from . import _whisper  # mlx-audio's Whisper: imported here, off the server's start

        _whisper.prepare(model.model)
        info = SpeechModelInfo(
            str(model.path), model.multilingual, model.word_timestamps, _whisper.LANGUAGES
        )
        return info, (model.model, _whisper)

    def _serve(self, loaded: tuple[Any, ModuleType]) -> None:
        model, whisper = loaded
        while (job := self._commands.get()) is not None:
            self._transcribe(job, model, whisper)

    def _finish(self, exc: BaseException | None) -> None:
        """Transcriptions queued behind the stop: confirmed, never run."""
        while True:
            try:
                left = self._commands.get_nowait()
            except queue.Empty:
                return
            if left is not None:
                stopped = EngineUnavailable("the speech engine stopped")
                self._post(SpeechPost(left.job_id, self._counters(), stopped, ended=True))

    def _transcribe(self, job: _Transcribe, model: Any, whisper: ModuleType) -> None:
        """Run one transcription; its events and its confirmation go to Trio."""

        def check() -> None:
            if job.stop.is_set():
                raise whisper.Stopped
            if fault_points.ARMED:
                fault_points.reach("whisper_window", job.label)

        def on_token() -> None:
            self._tokens += 1

        def emit(window: Window) -> None:
            self._windows += 1
            self._post(SpeechPost(job.job_id, self._counters(), window))

        outcome: SpeechEvent | None = None
        self._running = True
        self._post(SpeechPost(job.job_id, self._counters()))
        try:
            outcome = whisper.transcribe(model, job.request, check, emit, on_token)
        except whisper.Stopped:
            self._cancelled += 1
        except Exception:
            log.exception("a transcription failed")
            outcome = EngineUnavailable("the transcription failed; the server's log says why")
        finally:
            self._running = False
            self._post(SpeechPost(job.job_id, self._counters(), outcome, ended=True))

    def _counters(self) -> SpeechCounters:
        return SpeechCounters(self._running, self._windows, self._tokens, self._cancelled)
