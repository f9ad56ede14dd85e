"""An upload's audio to Whisper's input (mono, 16 kHz, float32), its cost bounded before it
is paid.

A few bytes of audio can stand for hours of decoding: a FLAC of silence is some bytes per
65,535 frames, and a header may name any rate and channel count. So WAV, MP3 and FLAC
(miniaudio decodes them, no ffmpeg) are read in two steps. First their header: its rate
(`MIN_RATE`..`MAX_RATE`), channels (at most `MAX_CHANNELS`), duration (`max_seconds`) and
the samples to decode (`SAMPLES_PER_SECOND` for each allowed second) are checked, a 400
before any decoding. Then the samples, a second of audio at a time, each second preceded by
a cancellation check (`_checkpoint`) and counted against the same limits (a header can lie).

Resampling to 16 kHz uses mlx-audio's polyphase FIR, as its reader does, where the rate's
ratio to 16 kHz is a fraction of small terms (every common rate: 44.1 kHz is 160/441). Its
filter grows with those terms: an odd rate (22,051 Hz, 383,999 Hz) would build a filter of
millions of taps and take minutes. Those rates are resampled by miniaudio's own converter
instead, at a cost linear in the samples.

Other containers (Ogg, M4A, WebM), and a file whose header miniaudio cannot read (an ID3
tag before AAC), go to ffmpeg when it is on PATH (`decode_other`): a subprocess that
ffmpeg's own resampler and the duration limit bound, read a second at a time after a
cancellation check, and killed when its request is cancelled.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import IO

import attrs
import numpy as np
import numpy.typing as npt

from ..engine import SAMPLE_RATE
from ._checkpoint import checkpoint
from ._errors import InvalidRequest

MIN_RATE = 1_000
MAX_RATE = 384_000
MAX_CHANNELS = 8
SAMPLES_PER_SECOND = 96_000
"""Samples decoded (frames x channels, at the file's rate) for each second `max_seconds`
allows: a half-hour limit decodes half an hour of 48 kHz stereo, or less of more."""
MAX_FIR_TERM = 4096
"""The largest term of the reduced ratio to 16 kHz resampled by the FIR (352.8 kHz is
20/441; 384 kHz is 1/24)."""


@attrs.frozen
class AudioHeader:
    rate: int
    channels: int
    frames: int
    """As the header says (0: unknown, which decodes to nothing)."""


def read_header(kind: str, data: bytes) -> AudioHeader | None:
    """The header of a WAV, MP3 or FLAC file; None when miniaudio cannot read it (ffmpeg
    may: an ID3 tag before AAC or FLAC looks like MP3)."""
    import miniaudio

    get_info = {
        "wav": miniaudio.wav_get_info,
        "mp3": miniaudio.mp3_get_info,
        "flac": miniaudio.flac_get_info,
    }[kind]
    try:
        info = get_info(data)
    except miniaudio.DecodeError:
        return None
    return AudioHeader(rate=info.sample_rate, channels=info.nchannels, frames=info.num_frames)


def check_header(header: AudioHeader, max_seconds: float) -> None:
    """Refuse (400) audio whose rate, channels, duration or samples are past the limits."""
    if not MIN_RATE <= header.rate <= MAX_RATE:
        raise invalid_audio(
            f"the audio's sample rate is {header.rate} Hz; this server takes "
            f"{MIN_RATE}..{MAX_RATE} Hz"
        )
    if not 1 <= header.channels <= MAX_CHANNELS:
        raise invalid_audio(
            f"the audio has {header.channels} channels; this server takes 1..{MAX_CHANNELS}"
        )
    if header.frames > max_seconds * header.rate:
        raise too_long(max_seconds)
    if header.frames * header.channels > sample_budget(max_seconds):
        raise too_many_samples(header, max_seconds)


def decode_native(data: bytes, header: AudioHeader, max_seconds: float) -> npt.NDArray[np.float32]:
    """Samples of a WAV, MP3 or FLAC file whose header passed `check_header`: mono, 16 kHz,
    float32, at most a frame past `max_seconds`. Raises InvalidRequest past the limits or
    for a file that does not decode; `trio.Cancelled` (on a Trio worker thread) once the
    request is cancelled. Blocking."""
    from mlx_audio.resample import resample_audio_chunks

    limit = math.floor((max_seconds + 1) * SAMPLE_RATE)  # output frames, as mlx-audio's
    up, down = _ratio(header.rate)
    if header.rate == SAMPLE_RATE or max(up, down) > MAX_FIR_TERM:
        # As it is, or through miniaudio's converter: chunks arrive at 16 kHz.
        chunks = _chunks(data, header, SAMPLE_RATE, max_seconds)
        return joined_until(chunks, limit)
    if header.frames == 0:
        return np.empty(0, dtype=np.float32)
    samples = resample_audio_chunks(
        _chunks(data, header, header.rate, max_seconds),
        header.rate,
        SAMPLE_RATE,
        header.frames,
        chunk_duration_seconds=1.0,
        max_output_frames=limit,
    )
    return np.asarray(samples, dtype=np.float32)


def decode_other(data: bytes, max_seconds: float) -> npt.NDArray[np.float32]:
    """Samples of a container miniaudio does not read, through ffmpeg (on PATH), mono at
    16 kHz, at most a second past `max_seconds` (so that the caller can tell too long audio).
    Raises InvalidRequest for a file that does not decode. Cancellable between seconds of
    audio: a cancelled request's ffmpeg is killed and reaped before `trio.Cancelled` rises.

    Why not mlx-audio's reader, which runs ffmpeg too: it waits for the whole decoding in
    one `subprocess.run`, which nothing can stop, after an `ffprobe` run."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise undecodable()
    frames = round((max_seconds + 1) * SAMPLE_RATE)
    # Seconds as ffmpeg takes them (fixed point that fits int64 microseconds); asetpts sets
    # timestamps to the sample count, so that -t cuts at a frame count even where a file's
    # timestamps jump.
    seconds = min((frames + 1) / SAMPLE_RATE, 1e12)
    with tempfile.NamedTemporaryFile() as source, tempfile.TemporaryFile() as errors:
        source.write(data)  # a file, not a pipe: an M4A's index may follow its audio
        source.flush()
        command = [
            ffmpeg, "-nostdin", "-v", "error", "-i", source.name,
            "-af", "asetpts=N/SR/TB", "-t", f"{seconds:.6f}",
            "-f", "f32le", "-ac", "1", "-ar", str(SAMPLE_RATE), "pipe:1",
        ]  # fmt: skip
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors
        )
        assert process.stdout is not None
        read: list[bytes] = []
        try:
            while chunk := _second(process.stdout):
                read.append(chunk)
            status = process.wait()
        finally:
            if process.poll() is None:  # cancelled: stop it now, not when it is done
                process.kill()
                process.wait()
            process.stdout.close()
    joined = b"".join(read)
    if status != 0 or not joined:
        raise undecodable()
    usable = len(joined) - len(joined) % 4  # whole float32 samples
    return np.frombuffer(joined[:usable], dtype=np.float32)[:frames].copy()


def _second(stdout: IO[bytes]) -> bytes:
    """The next second of ffmpeg's float32 samples (less at the end, none past it), after a
    cancellation check."""
    checkpoint()
    return stdout.read(4 * SAMPLE_RATE)


def _chunks(
    data: bytes, header: AudioHeader, rate: int, max_seconds: float
) -> Iterator[npt.NDArray[np.float32]]:
    """Mono float32 chunks of a second at `rate` (miniaudio mixes the channels, and converts
    the rate when it is not the file's), each after a cancellation check. Raises
    InvalidRequest when the decoded samples pass what the header was allowed (a lying one)."""
    import miniaudio

    try:
        stream = miniaudio.stream_memory(
            data,
            output_format=miniaudio.SampleFormat.SIGNED16,
            nchannels=1,
            sample_rate=rate,
            frames_to_read=rate,
        )
    except miniaudio.DecodeError:
        raise undecodable() from None
    budget = sample_budget(max_seconds)
    frames = 0
    try:
        while True:
            checkpoint()
            try:
                raw = next(stream)
            except StopIteration:
                return
            except miniaudio.DecodeError:
                raise undecodable() from None
            frames += len(raw)
            source_frames = frames * header.rate / rate
            if source_frames * header.channels > budget:
                raise too_many_samples(header, max_seconds)
            yield np.asarray(raw, dtype=np.int16).astype(np.float32) / 32768.0
    finally:
        stream.close()


def joined_until(chunks: Iterator[npt.NDArray[np.float32]], limit: int) -> npt.NDArray[np.float32]:
    """Chunks end to end, reading no further once `limit` samples are in."""
    parts: list[npt.NDArray[np.float32]] = []
    count = 0
    for chunk in chunks:
        parts.append(chunk)
        count += len(chunk)
        if count >= limit:
            break
    joined = np.concatenate(parts) if parts else np.empty(0, dtype=np.float32)
    return joined[:limit]


def _ratio(rate: int) -> tuple[int, int]:
    """16 kHz over `rate`, as the reduced fraction up/down the polyphase FIR would use."""
    gcd = math.gcd(rate, SAMPLE_RATE)
    return SAMPLE_RATE // gcd, rate // gcd


def sample_budget(max_seconds: float) -> int:
    return math.floor(max_seconds * SAMPLES_PER_SECOND)


def invalid_audio(message: str) -> InvalidRequest:
    return InvalidRequest(message, param="file", code="invalid_audio")


def undecodable() -> InvalidRequest:
    return invalid_audio("the audio file could not be decoded (corrupt or unsupported)")


def too_long(max_seconds: float) -> InvalidRequest:
    return InvalidRequest(
        f"the audio is longer than {max_seconds:g} seconds, this server's limit "
        "(--max-audio-seconds)",
        param="file",
        code="audio_too_long",
    )


def too_many_samples(header: AudioHeader, max_seconds: float) -> InvalidRequest:
    return InvalidRequest(
        f"the audio holds more samples than this server decodes ({header.channels} channels "
        f"at {header.rate} Hz: at most {sample_budget(max_seconds)} samples, "
        f"--max-audio-seconds of 48 kHz stereo)",
        param="file",
        code="audio_too_long",
    )
