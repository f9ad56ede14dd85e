"""Containers miniaudio does not read (Ogg, M4A) decoded by ffmpeg: the samples, the length
limit, and a cancelled request's ffmpeg stopped before its decoding ends. ffmpeg is
imageio-ffmpeg's build (a test dependency), put on PATH as `ffmpeg` (tests/conftest.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import trio

from mlx_nursery.generation import AudioLimits, AudioUpload, InvalidRequest, decode_audio
from tests.speech_helpers import encoded_tone


@pytest.mark.parametrize(
    ("name", "codec"), [("a.ogg", ("-c:a", "libvorbis")), ("a.m4a", ("-c:a", "aac"))]
)
def test_ffmpeg_decodes_other_containers_to_mono_16khz(
    ffmpeg: Path, tmp_path: Path, name: str, codec: tuple[str, ...]
) -> None:
    data = encoded_tone(ffmpeg, tmp_path / name, 2.0, *codec)  # an M4A's index follows its audio
    samples = decode_audio(AudioUpload(name, data), AudioLimits())
    assert samples.dtype == np.float32 and abs(samples.size - 32_000) < 1_600
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * 16_000 / samples.size - 440) < 5  # the tone, resampled


def test_ffmpeg_output_past_the_length_limit_is_refused(ffmpeg: Path, tmp_path: Path) -> None:
    data = encoded_tone(ffmpeg, tmp_path / "a.ogg", 4.0, "-c:a", "libvorbis")
    with pytest.raises(InvalidRequest) as refused:
        decode_audio(AudioUpload("a.ogg", data), AudioLimits(max_seconds=2.0))
    assert refused.value.code == "audio_too_long"


def _children_named(name: str) -> list[int]:
    """This process's children whose command is `name` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and command.startswith(name):
                found.append(int(entry.name))
    return found


async def test_a_cancelled_decoding_stops_its_ffmpeg(ffmpeg: Path, tmp_path: Path) -> None:
    """The request is cancelled once its preparation thread has started; ffmpeg is killed
    at the next second of audio and reaped before `trio.Cancelled` reaches the thread."""
    data = encoded_tone(ffmpeg, tmp_path / "a.ogg", 30.0, "-c:a", "libvorbis")
    started, go, done = trio.Event(), threading.Event(), threading.Event()
    outcome: list[object] = []

    def prepare() -> None:
        try:
            trio.from_thread.run_sync(started.set)
            go.wait()  # the request is cancelled by now
            outcome.append(decode_audio(AudioUpload("a.ogg", data), AudioLimits()))
        except BaseException as exc:
            outcome.append(exc)
            raise
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def request() -> None:
            with scope:
                await trio.to_thread.run_sync(prepare, abandon_on_cancel=True)

        nursery.start_soon(request)
        await started.wait()
        scope.cancel()
        go.set()
    await trio.to_thread.run_sync(done.wait)
    assert len(outcome) == 1 and isinstance(outcome[0], trio.Cancelled)
    assert _children_named("ffmpeg") == []
