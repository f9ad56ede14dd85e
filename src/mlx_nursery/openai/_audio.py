"""/v1/audio/transcriptions and /v1/audio/translations: the form checked, the audio decoded.

The request is a multipart form (OpenAI's): its fields arrive as strings, checked here
against OpenAI's schema (`CreateTranscriptionRequest`, `CreateTranslationRequest`). Fields
OpenAI has and this server does not implement (`include`, `chunking_strategy`,
speaker references, `languages`, `keywords`) are 400 `unsupported_parameter`, unknown ones
400 "Unrecognized request argument", as the JSON APIs answer.

Audio is decoded by miniaudio (WAV, MP3, FLAC, with no ffmpeg; other containers through
mlx-audio's reader and ffmpeg when it is on PATH), mixed to mono and resampled to 16 kHz,
within the size, rate, channel and duration limits, checked from the header before
decoding (`_audio_decode`). Bad or empty audio is a 400, never a 500.
No MLX here: this runs on a preparation thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, cast

import attrs

from ..engine import (
    DEFAULT_TEMPERATURES,
    SpeechModelInfo,
    SpeechTask,
    TranscriptionRequest,
)
from ..generation import AudioLimits, AudioUpload, InvalidRequest, decode_audio, quoted

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
RESPONSE_FORMATS: tuple[ResponseFormat, ...] = ("json", "text", "srt", "verbose_json", "vtt")

_COMMON = ("file", "model", "prompt", "response_format", "temperature", "stream")
_FIELDS: dict[SpeechTask, frozenset[str]] = {
    "transcribe": frozenset(
        (*_COMMON, "language", "timestamp_granularities[]", "timestamp_granularities")
    ),
    "translate": frozenset(_COMMON),
}
_UNSUPPORTED = frozenset(
    (
        "include[]",
        "include",
        "chunking_strategy",
        "known_speaker_names[]",
        "known_speaker_references[]",
        "languages[]",
        "keywords[]",
    )
)
_MAX_PROMPT_CHARS = 10_000
"""Whisper reads at most half its context (224 tokens) of a prompt; this bounds the work."""


@attrs.frozen
class PreparedSpeech:
    """A checked transcription request, ready for the speech engine."""

    request: TranscriptionRequest
    model: str
    task: SpeechTask
    response_format: ResponseFormat
    stream: bool
    segment_timestamps: bool
    word_timestamps: bool


def speech_model_name(fields: Mapping[str, list[str]]) -> str:
    """The form's `model` (read before the rest, to find the model). Raises the 400."""
    values = fields.get("model")
    if not values or not values[0]:
        raise InvalidRequest(
            "you must provide a model parameter", param="model", code="missing_required_parameter"
        )
    return values[0]


def prepare_speech(
    task: SpeechTask,
    fields: Mapping[str, list[str]],
    upload: AudioUpload | None,
    model: SpeechModelInfo,
    limits: AudioLimits,
) -> PreparedSpeech:
    """Check the form and decode its audio. Raises InvalidRequest (400) or RequestTooLarge
    (413) naming the field. Decodes audio: call it on a worker thread."""
    _check_names(task, fields)
    text = _FormText(fields)
    response_format = text.choice("response_format", RESPONSE_FORMATS, "json")
    stream = text.boolean("stream")
    if stream and response_format not in ("json", "text"):
        raise InvalidRequest(
            "stream=true streams transcript.text.delta events; response_format must be json "
            f"or text, not {quoted(response_format)}",
            param="response_format",
            code="invalid_value",
        )
    granularities = text.granularities()
    if granularities and response_format != "verbose_json":
        raise InvalidRequest(
            "timestamp_granularities needs response_format verbose_json",
            param="timestamp_granularities",
            code="invalid_value",
        )
    words = "word" in granularities
    if words and not model.word_timestamps:
        raise InvalidRequest(
            "this model has no alignment heads (generation_config.json): it cannot give "
            "word timestamps",
            param="timestamp_granularities",
            code="unsupported_value",
        )
    language = _language(text.optional("language"), model)
    prompt = text.optional("prompt")
    if prompt is not None and len(prompt) > _MAX_PROMPT_CHARS:
        raise InvalidRequest(
            f"prompt is longer than {_MAX_PROMPT_CHARS} characters",
            param="prompt",
            code="string_above_max_length",
        )
    temperature = text.number("temperature", 0.0)
    if upload is None:
        raise InvalidRequest(
            "you must provide a file parameter", param="file", code="missing_required_parameter"
        )
    audio = decode_audio(upload, limits)
    request = TranscriptionRequest(
        audio,
        task=task,
        language=language if task == "transcribe" else None,
        prompt=prompt or None,
        temperatures=DEFAULT_TEMPERATURES if temperature == 0 else (temperature,),
        word_timestamps=words,
    )
    return PreparedSpeech(
        request,
        model=speech_model_name(fields),
        task=task,
        response_format=response_format,
        stream=stream,
        segment_timestamps=not granularities or "segment" in granularities,
        word_timestamps=words,
    )


def _check_names(task: SpeechTask, fields: Mapping[str, list[str]]) -> None:
    allowed = _FIELDS[task]
    for name in fields:
        if name in allowed:
            continue
        if name in _UNSUPPORTED or name.rstrip("[]") + "[]" in _UNSUPPORTED:
            raise InvalidRequest(
                f"{name.rstrip('[]')} is not supported by this server",
                param=name.rstrip("[]"),
                code="unsupported_parameter",
            )
        raise InvalidRequest(f"Unrecognized request argument supplied: {quoted(name)}", param=name)


def _language(value: str | None, model: SpeechModelInfo) -> str | None:
    if value is None:
        return None
    code = model.languages.get(value.strip().lower())
    if code is None:
        raise InvalidRequest(
            f"language {quoted(value)} is not an ISO-639-1 code Whisper knows",
            param="language",
            code="invalid_value",
        )
    if code != "en" and not model.multilingual:
        raise InvalidRequest(
            f"this model is English-only; it cannot transcribe language {quoted(value)}",
            param="language",
            code="unsupported_value",
        )
    return code


@attrs.frozen
class _FormText:
    """The form's text fields, each given at most once (arrays aside)."""

    fields: Mapping[str, list[str]]

    def optional(self, name: str) -> str | None:
        values = self.fields.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise InvalidRequest(f"{name} is given more than once", param=name)
        return values[0]

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> ResponseFormat:
        value = self.optional(name)
        if value is None:
            return cast(ResponseFormat, default)
        if value not in allowed:
            raise InvalidRequest(
                f"{quoted(value)} is not one of {', '.join(allowed)} - '{name}'",
                param=name,
                code="invalid_value",
            )
        return cast(ResponseFormat, value)

    def boolean(self, name: str) -> bool:
        value = self.optional(name)
        if value is None or value.lower() in ("false", "0"):
            return False
        if value.lower() in ("true", "1"):
            return True
        raise InvalidRequest(
            f"{name} must be true or false, got {quoted(value)}", param=name, code="invalid_type"
        )

    def number(self, name: str, default: float) -> float:
        value = self.optional(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (0.0 <= number <= 1.0):
            raise InvalidRequest(
                f"{name} must be a number between 0 and 1, got {quoted(value)}",
                param=name,
                code="invalid_value",
            )
        return number

    def granularities(self) -> frozenset[str]:
        values = [
            *self.fields.get("timestamp_granularities[]", []),
            *self.fields.get("timestamp_granularities", []),
        ]
        for value in values:
            if value not in ("segment", "word"):
                raise InvalidRequest(
                    f"{quoted(value)} is not one of segment, word - 'timestamp_granularities'",
                    param="timestamp_granularities",
                    code="invalid_value",
                )
        return frozenset(values)
