"""Audio for the speech tests: deterministic clips, as arrays and as WAV bytes."""

from __future__ import annotations

import io
import wave

import numpy as np
import numpy.typing as npt

RATE = 16_000


def clip(seconds: float, seed: int = 0) -> npt.NDArray[np.float32]:
    """A deterministic clip: a wandering tone under noise (a random Whisper needs no speech)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    tone = 0.3 * np.sin(2 * np.pi * (220 + 40 * np.sin(t)) * t)
    return (tone + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def wav_bytes(samples: npt.NDArray[np.float32], rate: int = RATE, channels: int = 1) -> bytes:
    """16-bit PCM WAV of `samples` (repeated across `channels`)."""
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    if channels > 1:
        pcm = np.repeat(pcm[:, None], channels, axis=1).reshape(-1)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()
