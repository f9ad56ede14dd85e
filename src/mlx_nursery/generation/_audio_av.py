"""Containers miniaudio does not read (Ogg/Opus, WebM, M4A: what browsers' MediaRecorder and
phones record), decoded through PyAV (libav, already a dependency for speech's encoders) where
no ffmpeg is on PATH.

ffmpeg in a subprocess stays the first choice where there is one (`decode_other`): a decoder
bug in a hostile file then takes down a subprocess, not the server. In-process, the same
bounds hold as for the native formats: each stream's rate and channels are checked before its
samples are decoded, the decoded samples count against `sample_budget` (a small file can
stand for hours), the output stops a second past `max_seconds` (so that the caller can tell
too long audio), and a cancellation check comes before each second of output.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..engine import SAMPLE_RATE
from ._audio_decode import (
    MAX_CHANNELS,
    MAX_RATE,
    MIN_RATE,
    AudioHeader,
    invalid_audio,
    joined_until,
    sample_budget,
    too_many_samples,
    undecodable,
)
from ._checkpoint import checkpoint

if TYPE_CHECKING:
    from av.audio.frame import AudioFrame
    from av.audio.stream import AudioStream
    from av.container import InputContainer


def decode_with_av(data: bytes, max_seconds: float) -> npt.NDArray[np.float32]:
    """The first audio stream's samples: mono, 16 kHz, float32, at most a second past
    `max_seconds`. Raises InvalidRequest for a file that does not decode, has no audio, or
    passes the rate, channel or sample limits. Cancellable between seconds of output."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise invalid_audio("the file holds no audio stream")
            stream = container.streams.audio[0]
            rate, channels = stream.rate or 0, stream.channels or 0
            if not MIN_RATE <= rate <= MAX_RATE or not 1 <= channels <= MAX_CHANNELS:
                raise invalid_audio(
                    f"the audio's {channels} channels at {rate} Hz are outside what this "
                    f"server decodes ({MIN_RATE}-{MAX_RATE} Hz, 1-{MAX_CHANNELS} channels)"
                )
            chunks = _mono_16k(container, stream, AudioHeader(rate, channels, 0), max_seconds)
            return joined_until(chunks, round((max_seconds + 1) * SAMPLE_RATE))
    except av.error.FFmpegError:
        raise undecodable() from None


def _mono_16k(
    container: InputContainer,
    stream: AudioStream,
    header: AudioHeader,
    max_seconds: float,
) -> Iterator[npt.NDArray[np.float32]]:
    """Resampled output a second or so at a time, each after a cancellation check; the
    decoded samples counted against the budget as they come."""
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    budget = sample_budget(max_seconds)
    decoded = 0
    pending: list[npt.NDArray[np.float32]] = []
    pending_count = 0
    checkpoint()
    for frame in container.decode(stream):
        decoded += frame.samples * header.channels
        if decoded > budget:
            raise too_many_samples(header, max_seconds)
        for out in resampler.resample(frame):
            pending.append(_samples(out))
            pending_count += len(pending[-1])
        if pending_count >= SAMPLE_RATE:
            yield np.concatenate(pending)
            pending, pending_count = [], 0
            checkpoint()
    pending += [_samples(out) for out in resampler.resample(None)]  # what it still holds
    if pending:
        yield np.concatenate(pending)


def _samples(frame: AudioFrame) -> npt.NDArray[np.float32]:
    """A resampled frame's mono float32 samples."""
    return frame.to_ndarray().reshape(-1).astype(np.float32, copy=False)
