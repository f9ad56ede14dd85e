"""The OpenAI layer's audio parts without a model: decoding within limits, subtitles."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_nursery.engine import Segment
from mlx_nursery.generation import (
    AudioLimits,
    AudioUpload,
    InvalidRequest,
    RequestTooLarge,
    decode_audio,
    sniff_format,
)
from mlx_nursery.openai._audio_output import srt, vtt
from tests.speech_helpers import clip, flac_bytes, wav_bytes


def test_stereo_at_another_rate_becomes_mono_16khz() -> None:
    samples = decode_audio(
        AudioUpload("a.wav", wav_bytes(clip(2), rate=44_100, channels=2)), AudioLimits()
    )
    assert samples.dtype == np.float32 and samples.ndim == 1
    # 32,000 frames at 44.1 kHz last 0.726 s: 11,610 samples at 16 kHz.
    assert abs(len(samples) - round(32_000 * 16_000 / 44_100)) <= 16


def test_an_odd_rate_is_resampled_at_a_linear_cost() -> None:
    """383,999 Hz reduces to 16,000/383,999: the polyphase FIR would have 49 million taps
    (31 s for a second of audio); miniaudio's converter takes it instead."""
    rate = 383_999
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate).astype(np.float32)
    samples = decode_audio(AudioUpload("a.wav", wav_bytes(tone, rate=rate)), AudioLimits())
    assert samples.dtype == np.float32 and abs(len(samples) - 16_000) <= 16
    spectrum = np.abs(np.fft.rfft(samples[:16_000]))  # 1 Hz bins
    assert abs(int(np.argmax(spectrum)) - 440) <= 1  # the tone, at its pitch


def test_rate_channels_and_length_are_read_from_the_header() -> None:
    limits = AudioLimits(max_seconds=60)
    for audio, words in (
        (wav_bytes(clip(0.01), rate=999), "999 Hz"),
        (flac_bytes(384_001, 1, 100), "384001 Hz"),
        (wav_bytes(clip(0.01), channels=9), "9 channels"),
        (flac_bytes(16_000, 1, 16_000 * 61), "longer than 60 seconds"),
        (flac_bytes(96_000, 2, 96_000 * 31), "more samples"),  # 5.95M of 5.76M
    ):
        with pytest.raises(InvalidRequest, match=words):
            decode_audio(AudioUpload("a", audio), limits)
    assert len(decode_audio(AudioUpload("a", flac_bytes(96_000, 2, 96_000 * 29)), limits)) > 0


def test_limits_are_checked_before_and_after_decoding() -> None:
    with pytest.raises(RequestTooLarge):
        decode_audio(AudioUpload("a.wav", wav_bytes(clip(2))), AudioLimits(max_bytes=1000))
    with pytest.raises(InvalidRequest, match="longer than 1 seconds"):
        decode_audio(AudioUpload("a.wav", wav_bytes(clip(2))), AudioLimits(max_seconds=1))
    assert [sniff_format(b) for b in (b"OggS....", b"\x00\x00\x00\x20ftypM4A ", b"fLaC")] == [
        "ogg",
        "m4a",
        "flac",
    ]


def _segment(i: int, start: float, end: float, text: str) -> Segment:
    return Segment(i, 0, start, end, text, (), 0.0, -0.2, 1.1, 0.01)


def test_subtitles_number_and_time_the_spoken_segments() -> None:
    segments = (
        _segment(0, 0.0, 1.5, " Hello there."),
        _segment(1, 1.5, 1.5, ""),
        _segment(2, 61.25, 3725.004, " General Kenobi."),
    )
    assert srt(segments) == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
        "2\n00:01:01,250 --> 01:02:05,004\nGeneral Kenobi.\n"
    )
    assert vtt(segments) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
        "00:01:01.250 --> 01:02:05.004\nGeneral Kenobi.\n"
    )
