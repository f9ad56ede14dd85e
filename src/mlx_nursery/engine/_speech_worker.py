"""The speech thread: it loads a Whisper and runs its transcriptions, one at a time.

It knows nothing of Trio; the queue, the stop flags, the posts and the confirmations are
`LaneWorker`'s (`_lane_worker.py`). What is its own: the model (mlx-audio's Whisper and the
window loop, `_whisper.py`), which checks a transcription's stop flag before every window
and every decoder step, and posts each window as it ends; and its counters.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from ._errors import EngineUnavailable
from ._lane_worker import LaneJob, LanePost, LaneWorker
from ._speech_types import SpeechModelInfo, Transcript, TranscriptionRequest, Window

SpeechEvent = Window | Transcript | EngineUnavailable
"""What a transcription's channel carries: windows, then a transcript or an error."""


@attrs.frozen
class SpeechCounters:
    """The speech thread's counters since it started, as of one post."""

    running: bool = False
    windows: int = 0
    tokens: int = 0
    cancelled: int = 0


SpeechPost = LanePost[Window | Transcript, SpeechCounters]
"""One hop to Trio: a transcription's news, with the thread's counters."""

_Whisper = tuple[Any, ModuleType]
"""mlx-audio's Whisper (unchecked: mlx-audio has no type hints) and the window loop."""


class SpeechWorker(
    LaneWorker[TranscriptionRequest, SpeechModelInfo, _Whisper, Window | Transcript, SpeechCounters]
):
    """A Whisper's thread (`LaneWorker`): `submit` and `stop` from the Trio thread."""

    what = "speech engine"
    job_name = "transcription"

    def __init__(
        self,
        model: Path,
        post: Callable[[SpeechPost], None],
        on_ready: Callable[[SpeechModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        super().__init__(post, on_ready, on_exit)
        self._model_path = model
        # This thread's alone, as the base's are.
        self._windows = 0
        self._tokens = 0

    def _load(self) -> tuple[SpeechModelInfo, _Whisper]:
        from ..models import load_speech_model

        model = load_speech_model(self._model_path)
        from . import _whisper  # mlx-audio's Whisper: imported here, off the server's start

        _whisper.prepare(model.model)
        info = SpeechModelInfo(
            str(model.path), model.multilingual, model.word_timestamps, _whisper.LANGUAGES
        )
        return info, (model.model, _whisper)

    def _work(self, job: LaneJob[TranscriptionRequest], loaded: _Whisper) -> Transcript:
        """One transcription, window by window: a post per window as it ends."""
        model, whisper = loaded

        def on_token() -> None:
            self._tokens += 1

        def emit(window: Window) -> None:
            self._windows += 1
            self._send(job.job_id, window, ended=False)

        check = partial(job.check, "whisper_window")
        transcript: Transcript = whisper.transcribe(model, job.request, check, emit, on_token)
        return transcript

    def _counters(self) -> SpeechCounters:
        return SpeechCounters(self._running, self._windows, self._tokens, self._cancelled)
