"""A transcript as OpenAI returns it: json, text, srt, vtt, verbose_json; the stream's events.

Shapes follow OpenAI's `CreateTranscriptionResponseJson`, `...VerboseJson`,
`CreateTranslationResponse*`, `TranscriptTextDeltaEvent` and `TranscriptTextDoneEvent`.
A statistic Whisper could not compute (a window with no sampled token has no average
log probability: NaN) is sent as null, since JSON has no NaN.
"""

from __future__ import annotations

import math
from typing import Any

from ..engine import Segment, SpeechModelInfo, Transcript
from ._audio import PreparedSpeech

TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"


def transcript_body(
    prepared: PreparedSpeech, transcript: Transcript, model: SpeechModelInfo
) -> tuple[Any, str]:
    """The response body (a JSON value, or text) and its content type."""
    fmt = prepared.response_format
    if fmt == "text":
        return transcript.text, TEXT_CONTENT_TYPE
    if fmt == "srt":
        return srt(transcript.segments), TEXT_CONTENT_TYPE
    if fmt == "vtt":
        return vtt(transcript.segments), TEXT_CONTENT_TYPE
    usage = {"type": "duration", "seconds": transcript.duration}
    if fmt == "json":
        return {"text": transcript.text, "usage": usage}, JSON_CONTENT_TYPE
    body: dict[str, Any] = {
        "task": prepared.task,
        "language": language_name(transcript.language, model),
        "duration": transcript.duration,
        "text": transcript.text,
    }
    if prepared.word_timestamps:
        body["words"] = [
            {"word": w.word, "start": w.start, "end": w.end}
            for segment in transcript.segments
            for w in segment.words
        ]
    if prepared.segment_timestamps:
        body["segments"] = [_segment(s) for s in transcript.segments]
    body["usage"] = usage
    return body, JSON_CONTENT_TYPE


def delta_event(text: str) -> dict[str, Any]:
    return {"type": "transcript.text.delta", "delta": text}


def done_event(transcript: Transcript) -> dict[str, Any]:
    return {"type": "transcript.text.done", "text": transcript.text}


def language_name(code: str, model: SpeechModelInfo) -> str:
    """Whisper's English name for `code` ("english"), as OpenAI's verbose_json gives it."""
    names = [name for name, c in model.languages.items() if c == code and name != code]
    return names[0] if names else code


def srt(segments: tuple[Segment, ...]) -> str:
    blocks = [
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n"
        for i, s in enumerate(_spoken(segments), start=1)
    ]
    return "\n".join(blocks)


def vtt(segments: tuple[Segment, ...]) -> str:
    blocks = [
        f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n"
        for s in _spoken(segments)
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)


def _spoken(segments: tuple[Segment, ...]) -> list[Segment]:
    return [s for s in segments if s.text.strip()]


def _clock(seconds: float, decimal: str) -> str:
    millis = round(max(seconds, 0.0) * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def _segment(segment: Segment) -> dict[str, Any]:
    return {
        "id": segment.id,
        "seek": segment.seek,
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": _finite(segment.temperature),
        "avg_logprob": _finite(segment.avg_logprob),
        "compression_ratio": _finite(segment.compression_ratio),
        "no_speech_prob": _finite(segment.no_speech_prob),
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
