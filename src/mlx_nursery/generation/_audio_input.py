"""An uploaded audio file checked and decoded: its size, its container (sniffed from its
bytes, whatever its name says), then its samples (`_audio_decode`), mono 16 kHz float32
within the duration limit. Bad or empty audio is a 400, never a 500. No MLX here: this runs
on a preparation thread.
"""

from __future__ import annotations

import shutil

import attrs
import numpy as np
import numpy.typing as npt

from ..engine import SAMPLE_RATE
from ._audio_av import decode_with_av
from ._audio_decode import (
    check_header,
    decode_native,
    decode_other,
    invalid_audio,
    read_header,
    too_long,
)
from ._errors import RequestTooLarge, quoted

_NATIVE_FORMATS = ("wav", "mp3", "flac")


@attrs.frozen
class AudioLimits:
    """What one audio upload may be."""

    max_bytes: int = 25 << 20
    """The file's size (OpenAI's limit is 25 MB)."""
    max_seconds: float = 1800.0
    """Its duration once decoded: half an hour of 16 kHz float32 samples is 115 MB."""


@attrs.frozen
class AudioUpload:
    """The form's `file` part."""

    filename: str
    data: bytes


def decode_audio(upload: AudioUpload, limits: AudioLimits) -> npt.NDArray[np.float32]:
    """The upload's samples: mono, 16 kHz, float32. Raises RequestTooLarge past the size
    limit, InvalidRequest for empty, undecodable or too long audio, audio past the rate,
    channel or sample limits (read from its header, before decoding: `_audio_decode`), or a
    container this machine cannot decode (no ffmpeg). Cancellable between seconds of audio
    (`_checkpoint`)."""
    data = upload.data
    if len(data) > limits.max_bytes:
        raise RequestTooLarge(
            f"the audio file is larger than {limits.max_bytes} bytes, this server's limit "
            "(--max-audio-bytes)",
            param="file",
            code="audio_too_large",
        )
    if not data:
        raise invalid_audio("the audio file is empty")
    kind = sniff_format(data)
    if kind is None:  # a picture or a text named .wav: no decoder would take it
        raise invalid_audio(
            f"the file {quoted(upload.filename)} is not audio this server can read: its "
            "content is none of WAV, MP3, FLAC, Ogg, M4A, WebM, AIFF, WMA, AMR or CAF"
        )
    header = read_header(kind, data) if kind in _NATIVE_FORMATS else None
    if header is not None:
        check_header(header, limits.max_seconds)
        samples = decode_native(data, header, limits.max_seconds)
    elif shutil.which("ffmpeg") is not None:  # other containers, and headers miniaudio missed
        samples = decode_other(data, limits.max_seconds)
    else:  # no ffmpeg: libav in-process (`_audio_av`), bounded the same way
        samples = decode_with_av(data, limits.max_seconds)
    samples = samples.reshape(-1)
    if samples.size == 0:
        raise invalid_audio("the audio file holds no samples")
    if not np.isfinite(samples).all():
        raise invalid_audio("the audio file decodes to samples that are not finite")
    if samples.size / SAMPLE_RATE > limits.max_seconds:
        raise too_long(limits.max_seconds)
    return samples


def sniff_format(data: bytes) -> str | None:
    """The container its first bytes (its magic number, whatever its file name says) name:
    wav, mp3, flac (decoded here), or ogg, m4a, webm, aiff, wma, amr, caf (ffmpeg's); None:
    no audio container known."""
    head = data[:16]
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"\x30\x26\xb2\x75":  # the ASF header object's GUID
        return "wma"
    if head[:5] == b"#!AMR":
        return "amr"
    if head[:4] == b"caff":
        return "caf"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if head[:4] == b"OggS":
        return "ogg"
    if head[4:8] == b"ftyp":
        return "m4a"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    return None
