"""Speech's bytes: 16-bit PCM and its WAV header written here, and mp3, opus, aac and flac
encoded as the audio is made, in process, by PyAV (its wheels bundle FFmpeg's libraries:
LAME for mp3, libopus, FFmpeg's own aac and flac; no ffmpeg binary is run).

`SpeechEncoder` takes the synthesis's float32 chunks at the model's rate and returns the
bytes each completed, so a sentence's audio leaves with the sentence. Each format is a
container read as it arrives: mp3 frames, Ogg pages, ADTS frames, FLAC frames. The muxer
writes to a sink that cannot seek, so none goes back to patch what it wrote (mp3 gets no
Xing frame, FLAC's STREAMINFO leaves the length unknown, as a stream's must): bytes handed
out are final. Ogg closes a page every `OGG_PAGE_MICROSECONDS` of audio, not its default
second, so that an opus sentence is not held back for the next one.

A rate the codec does not take is resampled to the next one up (libopus has no
22.05 kHz) by the `AudioResampler` that PyAV's codec context puts before every encode, which
also converts the sample format and cuts the codec's frame size. KittenTTS and Kokoro make
24 kHz, which all four take as it is (Ogg Opus plays at 48 kHz whatever the rate encoded).

Encoding is CPU work: the route runs each call on a worker thread, one encoder per request,
one call at a time (never shared).
"""

from __future__ import annotations

import struct
from contextlib import suppress
from functools import cache
from typing import TYPE_CHECKING, Literal

import attrs
import numpy as np
import numpy.typing as npt

from .. import fault_points

if TYPE_CHECKING:
    from av.audio.stream import AudioStream
    from av.container import OutputContainer

Compressed = Literal["mp3", "opus", "aac", "flac"]
OGG_PAGE_MICROSECONDS = 100_000


@attrs.frozen
class _Codec:
    container: str
    """FFmpeg's muxer: one that streams."""
    codec: str
    bit_rate: int | None = None
    """None: the codec's default."""
    container_options: dict[str, str] = attrs.field(factory=dict)


CODECS: dict[Compressed, _Codec] = {
    # LAME's own default at the models' 24 kHz mono is thin for speech.
    "mp3": _Codec("mp3", "libmp3lame", bit_rate=64_000),
    "opus": _Codec(
        "ogg", "libopus", container_options={"page_duration": f"{OGG_PAGE_MICROSECONDS}"}
    ),
    "aac": _Codec("adts", "aac"),
    "flac": _Codec("flac", "flac"),
}


class EncodingFailed(Exception):
    """The encoder failed on the server's own audio (a bug, or FFmpeg's)."""


@cache
def encodable() -> frozenset[Compressed]:
    """The compressed formats this PyAV build writes: all four from PyPI's wheels; a build on
    a system FFmpeg may lack LAME or libopus. Blocking (the first call loads FFmpeg)."""
    import av

    found: set[Compressed] = set()
    for name, spec in CODECS.items():
        try:
            av.codec.Codec(spec.codec, "w")
            av.format.ContainerFormat(spec.container, "w")
        except ValueError:  # UnknownCodecError is one; an unknown muxer raises it bare
            continue
        found.add(name)
    return frozenset(found)


def finite_clipped(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """`samples` with NaN as silence and everything in [-1, 1]."""
    clean = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(clean, -1.0, 1.0).astype(np.float32, copy=False)


def pcm16(samples: npt.NDArray[np.float32]) -> bytes:
    """16-bit little-endian PCM of float samples (NaN as silence, clipped to [-1, 1])."""
    return (finite_clipped(samples) * 32767).astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte RIFF/WAVE header of 16-bit mono PCM; `data_bytes` None: length unknown (a
    stream), both sizes 0xFFFFFFFF."""
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", data)
    )


class _Sink:
    """Where the muxer writes: kept until taken. It has no `seek`, so PyAV tells FFmpeg the
    output cannot seek, and no muxer rewrites bytes already taken."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


@attrs.define(eq=False)
class SpeechEncoder:
    """One response's compressed audio, encoded chunk by chunk. Not thread-safe: one call at
    a time (on any thread); every call but `close` blocks on CPU work."""

    sample_rate: int
    """The rate of the samples it is given (the model's)."""
    _container: OutputContainer
    _stream: AudioStream
    _sink: _Sink
    _closed: bool = False

    @classmethod
    def open(cls, audio_format: Compressed, sample_rate: int) -> SpeechEncoder:
        """An encoder of `audio_format` for mono float samples at `sample_rate`. Allocates
        only (the codec opens on the first chunk). Raises EncodingFailed where this build
        lacks the format (`encodable`)."""
        import av

        spec = CODECS[audio_format]
        sink = _Sink()
        try:
            codec = av.codec.Codec(spec.codec, "w")
            container = av.open(sink, "w", format=spec.container, options=spec.container_options)
        except (ValueError, av.FFmpegError) as exc:
            raise EncodingFailed(f"cannot write {audio_format}") from exc
        try:
            rate = _codec_rate(codec.audio_rates, sample_rate)
            stream = container.add_stream(spec.codec, rate=rate, layout="mono")
            assert isinstance(stream, av.audio.stream.AudioStream)
            if spec.bit_rate is not None:
                stream.bit_rate = spec.bit_rate
        except BaseException as exc:
            container.close()  # its FFmpeg context now, not whenever the collector runs
            if isinstance(exc, ValueError | av.FFmpegError):
                raise EncodingFailed(f"cannot write {audio_format}") from exc
            raise
        return cls(sample_rate, container, stream, sink)

    def encode(self, samples: npt.NDArray[np.float32]) -> bytes:
        """The bytes that `samples` (the next chunk, mono float32 at `sample_rate`) completed;
        the codec may keep a frame or two back until the next chunk or `finish`. Raises
        EncodingFailed. Blocking; not cancellable (the route drops a cancelled call's bytes)."""
        import av

        if fault_points.ARMED:
            fault_points.reach("speech_encoding")
        if samples.size == 0:
            return b""
        mono = finite_clipped(samples).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(mono, format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        try:
            self._container.mux(self._stream.encode(frame))
        except (ValueError, av.FFmpegError) as exc:
            raise EncodingFailed("encoding speech failed") from exc
        return self._sink.take()

    def finish(self) -> bytes:
        """The rest: what the codec kept back, and the container's end; then closed. Raises
        EncodingFailed. Blocking."""
        import av

        try:
            self._container.mux(self._stream.encode(None))
            self._close()
        except (ValueError, av.FFmpegError) as exc:
            raise EncodingFailed("ending the speech's encoding failed") from exc
        return self._sink.take()

    def close(self) -> None:
        """Free the encoder, what it kept back dropped (a response that ended early). Idempotent;
        never raises. Quick (a container's end into memory): fine on the Trio thread."""
        import av

        with suppress(ValueError, av.FFmpegError):  # nothing is read from it any more
            self._close()
        self._sink.take()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._container.close()


def _codec_rate(rates: tuple[int, ...] | list[int] | None, rate: int) -> int:
    """`rate` where the codec takes it (None: any), else the codec's next rate up (its
    highest, past them all)."""
    if not rates or rate in rates:
        return rate
    higher = [r for r in rates if r > rate]
    return min(higher) if higher else max(rates)
