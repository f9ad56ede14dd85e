"""/v1/audio/speech: OpenAI's request (`CreateSpeechRequest`) checked against the model, and
the audio it answers with: raw bytes (`stream_format` "audio"), or `speech.audio.delta` /
`speech.audio.done` SSE events ("sse").

Formats: wav and pcm (16-bit little-endian mono at the model's rate: KittenTTS and Kokoro
make 24 kHz, OpenAI's pcm rate) are written here; mp3, opus, aac and flac need ffmpeg on
PATH (as decoding an uploaded m4a does), else they are a 400 that names the format. OpenAI's
default is mp3; without ffmpeg a request that names no format gets wav (its Content-Type
says so) rather than a refusal that the official SDK's plain call would hit. A wav streamed
chunk by chunk cannot know its length up front: its header says "unknown" (0xFFFFFFFF), as
OpenAI's own streamed wav does; players read to the end.
"""

from __future__ import annotations

import shutil
import struct
from typing import Any, Literal

import attrs
import numpy as np
import numpy.typing as npt

from ..engine import SynthesisModelInfo, SynthesisRequest, Synthesized
from ..generation import InvalidRequest, quoted, structure

Format = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
FORMATS: tuple[Format, ...] = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES: dict[Format, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
FFMPEG_ARGS: dict[Format, tuple[str, ...]] = {
    "mp3": ("-f", "mp3"),
    "opus": ("-c:a", "libopus", "-f", "ogg"),
    "aac": ("-c:a", "aac", "-f", "adts"),
    "flac": ("-f", "flac"),
}
MAX_INPUT_CHARS = 4096
"""OpenAI's limit on `input`."""


@attrs.frozen
class SpeechBody:
    """OpenAI's `CreateSpeechRequest` (a custom voice object is not supported)."""

    model: str
    input: str
    voice: str
    response_format: str | None = None
    speed: float = 1.0
    stream_format: str = "audio"
    instructions: str | None = None


@attrs.frozen
class PreparedSynthesis:
    request: SynthesisRequest
    format: Format
    sse: bool
    """`stream_format` "sse": base64 deltas in events; else the audio bytes themselves."""
    sample_rate: int

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.sse else CONTENT_TYPES[self.format]


def ffmpeg_found() -> bool:
    return shutil.which("ffmpeg") is not None


def prepare_synthesis(body: Any, model: SynthesisModelInfo, ffmpeg: bool) -> PreparedSynthesis:
    """Check `body` against OpenAI's schema and the model (its voices), `ffmpeg`: whether
    the compressed formats can be made. Raises InvalidRequest (the 400) naming the field."""
    parsed = structure(body, SpeechBody)
    if not parsed.input.strip():
        raise InvalidRequest("input must not be empty", param="input", code="invalid_value")
    if len(parsed.input) > MAX_INPUT_CHARS:
        raise InvalidRequest(
            f"input is longer than {MAX_INPUT_CHARS} characters ({len(parsed.input)})",
            param="input",
            code="string_above_max_length",
        )
    if parsed.voice not in model.voices:
        raise InvalidRequest(
            f"voice {quoted(parsed.voice)} is not one of this model's voices: "
            + ", ".join(model.voices),
            param="voice",
            code="invalid_value",
        )
    if not 0.25 <= parsed.speed <= 4.0:
        raise InvalidRequest(
            f"speed must be from 0.25 to 4.0, got {parsed.speed}",
            param="speed",
            code="invalid_value",
        )
    if parsed.instructions is not None:
        raise InvalidRequest(
            "instructions are not supported by this server's speech models",
            param="instructions",
            code="unsupported_parameter",
        )
    if parsed.stream_format not in ("audio", "sse"):
        raise InvalidRequest(
            f"stream_format must be 'audio' or 'sse', got {quoted(parsed.stream_format)}",
            param="stream_format",
            code="invalid_value",
        )
    sse = parsed.stream_format == "sse"
    audio_format = _format(parsed.response_format, ffmpeg, sse)
    request = SynthesisRequest(parsed.input, parsed.voice, parsed.speed)
    return PreparedSynthesis(request, audio_format, sse, model.sample_rate)


def _format(name: str | None, ffmpeg: bool, sse: bool) -> Format:
    if name is None:
        return "mp3" if ffmpeg and not sse else "wav" if not sse else "pcm"
    for known in FORMATS:
        if name == known:
            break
    else:
        raise InvalidRequest(
            f"response_format must be one of {', '.join(FORMATS)}, got {quoted(name)}",
            param="response_format",
            code="invalid_value",
        )
    if sse and known not in ("pcm", "wav"):
        raise InvalidRequest(
            f"response_format {quoted(known)} cannot be streamed as sse here: use pcm or wav",
            param="response_format",
            code="unsupported_value",
        )
    if known in FFMPEG_ARGS and not ffmpeg:
        raise InvalidRequest(
            f"response_format {quoted(known)} needs ffmpeg, which this server does not have: "
            "use wav or pcm",
            param="response_format",
            code="unsupported_value",
        )
    return known


def pcm16(samples: npt.NDArray[np.float32]) -> bytes:
    """16-bit little-endian PCM of float samples (NaN as silence, clipped to [-1, 1])."""
    clean = np.clip(np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    return (clean * 32767).astype("<i2").tobytes()


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


def ffmpeg_command(audio_format: Format, sample_rate: int) -> list[str]:
    """ffmpeg reading 16-bit mono PCM on stdin, writing `audio_format` to stdout."""
    return [
        "ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin",
        "-f", "s16le", "-ar", str(sample_rate), "-ac", "1", "-i", "pipe:0",
        *FFMPEG_ARGS[audio_format], "pipe:1",
    ]  # fmt: skip


def audio_delta_event(audio: str) -> dict[str, Any]:
    return {"type": "speech.audio.delta", "audio": audio}


def audio_done_event(end: Synthesized) -> dict[str, Any]:
    """OpenAI's usage: input tokens are the symbols (phonemes, or letters) spoken; these
    models generate audio samples, not tokens, so output tokens are 0."""
    usage = {"input_tokens": end.tokens, "output_tokens": 0, "total_tokens": end.tokens}
    return {"type": "speech.audio.done", "usage": usage}
