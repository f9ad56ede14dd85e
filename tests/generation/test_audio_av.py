"""Without ffmpeg on PATH, what browsers and phones record (WebM/Opus, Ogg/Opus, M4A/AAC)
decodes in-process through PyAV: mono 16 kHz samples of the tone, the length limit, a file
that does not decode refused with the API's 400."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from mlx_nursery.generation import (
    AudioLimits,
    AudioUpload,
    InvalidRequest,
    _audio_input,
    decode_audio,
)


def tone(container: str, codec: str, seconds: float, rate: int = 48_000) -> bytes:
    """`seconds` of a 440 Hz stereo tone, encoded by PyAV into `container` with `codec`."""
    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as file:
        stream = file.add_stream(codec, rate=rate, layout="stereo")
        t = np.arange(int(seconds * rate)) / rate
        wave = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(np.stack([wave, wave]), format="fltp", layout="stereo")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            file.mux(packet)
        for packet in stream.encode(None):
            file.mux(packet)
    return out.getvalue()


@pytest.fixture(autouse=True)
def no_ffmpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_audio_input.shutil, "which", lambda name: None)


@pytest.mark.parametrize(
    ("name", "container", "codec"),
    [("a.webm", "webm", "libopus"), ("a.ogg", "ogg", "libopus"), ("a.m4a", "mp4", "aac")],
)
def test_recordings_decode_to_mono_16khz_without_ffmpeg(
    name: str, container: str, codec: str
) -> None:
    samples = decode_audio(AudioUpload(name, tone(container, codec, 2.0)), AudioLimits())
    assert samples.dtype == np.float32 and abs(samples.size - 32_000) < 1_600
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * 16_000 / samples.size - 440) < 5  # the tone, resampled


def test_a_recording_past_the_length_limit_is_refused() -> None:
    data = tone("webm", "libopus", 4.0)
    with pytest.raises(InvalidRequest) as refused:
        decode_audio(AudioUpload("a.webm", data), AudioLimits(max_seconds=2.0))
    assert refused.value.code == "audio_too_long"


def test_a_recording_that_does_not_decode_is_a_400() -> None:
    data = tone("webm", "libopus", 1.0)
    broken = data[:64] + bytes(len(data) - 64)  # the header, then nothing a decoder can use
    with pytest.raises(InvalidRequest) as refused:
        decode_audio(AudioUpload("a.webm", broken), AudioLimits())
    assert refused.value.param == "file"
