"""/v1/audio/speech: OpenAI's request (`CreateSpeechRequest`) checked against the model, and
the audio it answers with: raw bytes (`stream_format` "audio"), or `speech.audio.delta` /
`speech.audio.done` SSE events ("sse"), whose deltas carry the same bytes in base64, in any
format (OpenAI's own example streams its default, mp3, as sse).

Formats: wav and pcm (16-bit little-endian mono at the model's rate: KittenTTS and Kokoro
make 24 kHz, OpenAI's pcm rate); mp3, opus, aac and flac encoded in process as the audio is
made (`_speech_encoding`). A format this server's PyAV build cannot write is a 400 that
names it; OpenAI's default, mp3, is written by every PyPI wheel (a build without LAME
answers a request that names no format with wav, its Content-Type saying so, or pcm in sse
events). A wav
streamed chunk by chunk cannot know its length up front: its header says "unknown"
(0xFFFFFFFF), as OpenAI's own streamed wav does; players read to the end.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any, Literal

import attrs

from ..engine import SynthesisModelInfo, SynthesisRequest, Synthesized
from ..generation import InvalidRequest, quoted, structure
from ._speech_encoding import Compressed

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
COMPRESSED: dict[Format, Compressed] = {"mp3": "mp3", "opus": "opus", "aac": "aac", "flac": "flac"}
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
    def compressed(self) -> Compressed | None:
        """The format, where an encoder writes it (`SpeechEncoder`); None: wav and pcm."""
        return COMPRESSED.get(self.format)

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.sse else CONTENT_TYPES[self.format]


def prepare_synthesis(
    body: Any, model: SynthesisModelInfo, writable: Set[Compressed]
) -> PreparedSynthesis:
    """Check `body` against OpenAI's schema and the model (its voices); `writable`: the
    compressed formats this server writes (`encodable`). Raises InvalidRequest (the 400)
    naming the field."""
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
    audio_format = _format(parsed.response_format, writable, sse)
    request = SynthesisRequest(parsed.input, parsed.voice, parsed.speed)
    return PreparedSynthesis(request, audio_format, sse, model.sample_rate)


def _format(name: str | None, writable: Set[Compressed], sse: bool) -> Format:
    if name is None:  # OpenAI's default, in the body or base64 in sse events alike
        return "mp3" if "mp3" in writable else "pcm" if sse else "wav"
    for known in FORMATS:
        if name == known:
            break
    else:
        raise InvalidRequest(
            f"response_format must be one of {', '.join(FORMATS)}, got {quoted(name)}",
            param="response_format",
            code="invalid_value",
        )
    if known in COMPRESSED and COMPRESSED[known] not in writable:
        raise InvalidRequest(
            f"response_format {quoted(known)} has no encoder on this server (its PyAV build "
            "lacks it): use wav or pcm",
            param="response_format",
            code="unsupported_value",
        )
    return known


def audio_delta_event(audio: str) -> dict[str, Any]:
    return {"type": "speech.audio.delta", "audio": audio}


def audio_done_event(end: Synthesized) -> dict[str, Any]:
    """OpenAI's usage: input tokens are the symbols (phonemes, or letters) spoken; these
    models generate audio samples, not tokens, so output tokens are 0."""
    usage = {"input_tokens": end.tokens, "output_tokens": 0, "total_tokens": end.tokens}
    return {"type": "speech.audio.done", "usage": usage}
