"""What the speech runtime takes and gives (plain attrs classes; no MLX, no Trio)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs
import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 16_000
"""Whisper's input: mono float32 samples at 16 kHz."""
WINDOW_SECONDS = 30.0
"""Whisper decodes 30 seconds of audio at a time."""

SpeechTask = Literal["transcribe", "translate"]

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Whisper's fallback ladder: a window whose greedy decode looks wrong (too repetitive, too
unlikely) is decoded again at the next temperature. OpenAI's API does this at temperature 0."""


@attrs.frozen(eq=False)
class TranscriptionRequest:
    """One audio clip to transcribe (or translate into English)."""

    audio: npt.NDArray[np.float32]
    """Mono samples at `SAMPLE_RATE`."""
    task: SpeechTask = "transcribe"
    language: str | None = None
    """ISO-639-1; None: detected (a multilingual model) or English (an English-only one)."""
    prompt: str | None = None
    """Text the first window is conditioned on (names, spelling, style)."""
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    """Tried in order per window until one decodes acceptably (one value: no fallback)."""
    word_timestamps: bool = False
    seed: int = 0
    """Sampling at a temperature above 0 draws from a key made from it: a request's result
    is a function of its input, whatever else the process samples."""
    max_window_tokens: int | None = None
    """Tokens decoded per window at most (None: the model's half context, Whisper's own)."""

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@attrs.frozen
class Word:
    word: str
    start: float
    end: float
    probability: float


@attrs.frozen
class Segment:
    """One timed piece of a transcript (Whisper's segment, as OpenAI's verbose_json has it)."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()


@attrs.frozen
class Window:
    """What one 30-second window added: its segments, and the transcript's new text (which
    every `Window` of a transcription concatenates to its final text)."""

    segments: tuple[Segment, ...]
    text: str


@attrs.frozen
class Transcript:
    """A finished transcription."""

    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...]
    windows: int
    """30-second windows decoded (a fallback's re-decodes not counted)."""


@attrs.frozen
class SpeechModelInfo:
    """What the API side may know of a loaded speech model (no MLX in it)."""

    path: str
    multilingual: bool
    word_timestamps: bool
    """Whether the model has alignment heads (its generation_config.json), which word
    timestamps need."""
    languages: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    """Whisper's languages: ISO-639-1 code, and English name, to code."""


@attrs.frozen
class SpeechStatistics:
    state: str
    lanes_borrowed: int
    queued: int
    running: bool
    """Whether the speech thread is transcribing now."""
    windows_decoded: int
    tokens_decoded: int
    """Decoder steps run since the engine started (fallback re-decodes included)."""
    cancelled: int
    """Transcriptions stopped before their end (cancelled, or their consumer fell behind)."""
