"""What the speech-synthesis runtime takes and gives (plain attrs classes; no MLX, no Trio)."""

from __future__ import annotations

import re

import attrs
import numpy as np
import numpy.typing as npt

_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")


def sentences(text: str) -> list[str]:
    """`text` cut after each sentence (and at line breaks), the pieces synthesized one by one:
    the first audio goes out once the first sentence is made, and a cancel stops the work
    between two of them, whatever the model's own segmenting."""
    return [piece.strip() for piece in _SENTENCE_END.split(text) if piece.strip()]


@attrs.frozen(eq=False)
class SynthesisRequest:
    """Text to speak in one voice."""

    text: str
    voice: str
    speed: float = 1.0
    """The model's speaking rate factor (1: its own)."""


@attrs.frozen(eq=False)
class AudioChunk:
    """One piece of a synthesis's audio, in order: mono float32 at `sample_rate`."""

    samples: npt.NDArray[np.float32]
    sample_rate: int
    tokens: int
    """The input symbols (phonemes, or letters) it was made from."""


@attrs.frozen
class Synthesized:
    """A finished synthesis: what its chunks added up to."""

    chunks: int
    samples: int
    tokens: int
    sample_rate: int

    @property
    def duration(self) -> float:
        return self.samples / self.sample_rate


@attrs.frozen
class SynthesisModelInfo:
    """What the API side may know of a loaded TTS model (no MLX in it)."""

    path: str
    model_type: str
    sample_rate: int
    voices: tuple[str, ...]


@attrs.frozen
class SynthesisStatistics:
    state: str
    lanes_borrowed: int
    queued: int
    running: bool
    """Whether the synthesis thread is synthesizing now."""
    chunks_synthesized: int
    samples_synthesized: int
    cancelled: int
    """Syntheses stopped before their end (cancelled, or their consumer fell behind)."""
