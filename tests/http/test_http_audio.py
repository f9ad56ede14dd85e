"""Transcription over HTTP with the tiny random-weight Whisper: the official SDK, httpx and raw
sockets against a real Hypercorn server. Every format; the stream's events add up to the
transcript; bad audio and bad fields are 4xx in OpenAI's envelope; a disconnect or the
deadline stops the speech thread and returns its lane."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from mlx_nursery.engine import SPEECH_THREAD_NAME, SpeechEngine
from tests.http.test_http_metrics import samples, value, weight_bytes
from tests.http_helpers import (
    chat_body,
    eventually,
    port_of,
    raw_http,
    read_until,
    running_server,
    sdk,
    validate,
    validate_error,
)
from tests.speech_helpers import RATE, clip, encoded_tone, wav_bytes

CLIP = wav_bytes(clip(2))


def speech_engine(server: Any, name: str = "tiny") -> SpeechEngine:
    slot = server.service.models.find(name)
    assert slot.hosted is not None and slot.hosted.speech is not None
    engine: SpeechEngine = slot.hosted.speech
    return engine


def multipart_request(path: str, fields: dict[str, str], audio: bytes) -> bytes:
    """A raw multipart/form-data POST (for tests that cut the connection)."""
    boundary = "mlxnurserytestboundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + audio
        + b"\r\n"
    )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n"
    )
    return head.encode() + body


async def test_every_format_and_the_stream_through_the_sdk(
    tiny_whisper: Path, tiny_model: Path
) -> None:
    async with running_server(
        None,
        model=(f"{tiny_whisper}=tiny", f"{tiny_model}=chat"),
        max_loaded_models=2,
        skip_warmup=True,
    ) as server:
        client = sdk(server)
        cards = {m.id: m.model_extra for m in (await client.models.list()).data}
        assert cards["tiny"] is not None and cards["chat"] is not None
        assert cards["tiny"]["kind"] == "speech" and cards["tiny"]["input_modalities"] == ["audio"]
        assert cards["chat"]["kind"] == "text"

        def upload(data: bytes = CLIP) -> tuple[str, bytes, str]:
            return ("clip.wav", data, "audio/wav")

        # Temperature 0 (the default): Whisper's fallback ladder, sampled from a seeded key.
        ladder = await client.audio.transcriptions.create(model="tiny", file=upload())
        assert ladder.text, "the random model transcribes something"
        # One temperature: one decode per window (quicker for the rest of the test).
        once = {"model": "tiny", "temperature": 0.3}
        verbose = await client.audio.transcriptions.create(
            file=upload(), response_format="verbose_json", **once
        )
        body = verbose.model_dump(exclude_unset=True)
        text = body["text"]
        assert body["language"] == "english" and body["duration"] == pytest.approx(2.0)
        assert "".join(s["text"] for s in body["segments"]) == text
        # Inside the audio, though the last window is padded to 30 s.
        assert all(0 <= s["start"] <= s["end"] <= body["duration"] for s in body["segments"])
        plain = await client.audio.transcriptions.create(
            file=upload(), response_format="text", **once
        )
        assert plain == text
        for segment in body["segments"]:  # a random model's NaN statistics are sent as null
            for key in ("temperature", "avg_logprob", "compression_ratio", "no_speech_prob"):
                segment[key] = 0.0 if segment[key] is None else segment[key]
        validate(body, "CreateTranscriptionResponseVerboseJson")
        worded = await client.audio.transcriptions.create(
            file=upload(), response_format="verbose_json", timestamp_granularities=["word"], **once
        )
        assert worded.words is not None and worded.segments is None
        assert all(0 <= w.start <= w.end <= worded.duration for w in worded.words)
        srt = await client.audio.transcriptions.create(file=upload(), response_format="srt", **once)
        spoken = [s for s in body["segments"] if s["text"].strip()]
        assert srt.count(" --> ") == len(spoken)

        # The stream: a delta per window with text, then the whole text, as without a stream
        # (several windows' deltas: tests/engine/test_speech_engine.py).
        stream = await client.audio.transcriptions.create(file=upload(), stream=True, **once)
        events = [event async for event in stream]
        assert [e.type for e in events] == ["transcript.text.delta", "transcript.text.done"]
        assert events[0].delta == events[1].text == text

        # An English-only model's translation into English is its transcript.
        translated = await client.audio.translations.create(file=upload(), **once)
        assert translated.text == text

        # Beside it, the text model answers chat; the speech model refuses chat.
        reply = await client.chat.completions.create(**chat_body(max_tokens=2) | {"model": "chat"})
        assert reply.choices[0].message.content is not None
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            refused = await http.post("/v1/chat/completions", json=chat_body(max_tokens=2))
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
            wrong = await http.post(
                "/v1/audio/transcriptions",
                data={"model": "chat"},
                files={"file": ("a.wav", CLIP, "audio/wav")},
            )
            assert wrong.status_code == 400 and wrong.json()["error"]["code"] == (
                "model_not_supported"
            )


BAD_REQUESTS: list[tuple[str, dict[str, str], bytes | None, int, str | None]] = [
    ("empty audio", {}, b"", 400, "invalid_audio"),
    ("text as a.wav", {}, b"hello, this is text" * 10, 400, "invalid_audio"),
    ("png as a.wav", {}, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64), 400, "invalid_audio"),
    ("corrupt ogg, without ffmpeg", {}, b"OggS" + bytes(200), 400, "invalid_audio"),
    ("corrupt wav", {}, b"RIFF\x64\x00\x00\x00WAVEfmt " + b"\xff" * 40, 400, "invalid_audio"),
    ("corrupt flac", {}, b"fLaC" + bytes(100), 400, "invalid_audio"),
    ("too long", {}, wav_bytes(clip(7)), 400, "audio_too_long"),
    ("too large", {}, wav_bytes(clip(9)), 413, "audio_too_large"),
    ("no file", {}, None, 400, "missing_required_parameter"),
    ("unknown field", {"colour": "blue"}, CLIP, 400, None),
    ("include", {"include[]": "logprobs"}, CLIP, 400, "unsupported_parameter"),
    ("words need verbose_json", {"timestamp_granularities[]": "word"}, CLIP, 400, "invalid_value"),
    ("bad granularity", {"timestamp_granularities[]": "char"}, CLIP, 400, "invalid_value"),
    ("english only", {"language": "fr"}, CLIP, 400, "unsupported_value"),
    ("no such language", {"language": "xx"}, CLIP, 400, "invalid_value"),
    ("temperature", {"temperature": "1.5"}, CLIP, 400, "invalid_value"),
    ("format", {"response_format": "docx"}, CLIP, 400, "invalid_value"),
    ("stream srt", {"stream": "true", "response_format": "srt"}, CLIP, 400, "invalid_value"),
]


async def test_bad_audio_and_bad_fields_are_4xx_in_the_envelope(tiny_whisper: Path) -> None:
    limits = {"max_audio_seconds": 6.0, "max_audio_bytes": 250_000}
    async with (
        running_server(tiny_whisper, **limits) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        for what, fields, audio, status, code in BAD_REQUESTS:
            # No file: a multipart form all the same (a urlencoded one is a 415, below).
            files = (
                {"file": ("a.wav", audio, "audio/wav")}
                if audio is not None
                else {"response_format": (None, "json")}
            )
            reply = await http.post(
                "/v1/audio/transcriptions", data={"model": "tiny", **fields}, files=files
            )
            assert reply.status_code == status, (what, reply.text)
            validate_error(reply.json())
            if code is not None:
                assert reply.json()["error"]["code"] == code, (what, reply.json())

        translation = await http.post(
            "/v1/audio/translations",
            data={"model": "tiny", "language": "en"},
            files={"file": ("a.wav", CLIP, "audio/wav")},
        )
        assert translation.status_code == 400  # translations take no language
        as_json = await http.post("/v1/audio/transcriptions", json={"model": "tiny"})
        assert as_json.status_code == 415
        validate_error(as_json.json())
        urlencoded = await http.post("/v1/audio/transcriptions", data={"model": "tiny"})
        assert urlencoded.status_code == 415  # no file in it: refused before it is parsed
        unknown = await http.post(
            "/v1/audio/transcriptions",
            data={"model": "nope"},
            files={"file": ("a.wav", CLIP, "audio/wav")},
        )
        assert unknown.status_code == 404

        # The server serves on.
        assert (await http.get("/health")).status_code == 200
        good = await http.post(
            "/v1/audio/transcriptions",
            data={"model": "tiny", "response_format": "text"},
            files={"file": ("a.wav", CLIP, "audio/wav")},
        )
        assert good.status_code == 200 and good.headers["content-type"].startswith("text/plain")
        assert speech_engine(server).statistics().lanes_borrowed == 0
        # A speech model reserves its weights: no KV budget, no prefix cache.
        metrics = samples((await http.get("/metrics")).text)
        reserved = {
            part: value(metrics, "mlx_nursery:model_reserved_bytes", model_name="tiny", part=part)
            for part in ("weights", "prefix_cache", "kv")
        }
        assert reserved == {"weights": weight_bytes(tiny_whisper), "prefix_cache": 0, "kv": 0}


async def test_ogg_and_m4a_are_transcribed_through_ffmpeg(
    tiny_whisper: Path, ffmpeg: Path, tmp_path: Path
) -> None:
    """With ffmpeg on PATH, the containers miniaudio does not read are transcribed; a
    corrupt one is a 400 in the envelope, and the server serves on."""
    ogg = encoded_tone(ffmpeg, tmp_path / "a.ogg", 2.0, "-c:a", "libvorbis")
    m4a = encoded_tone(ffmpeg, tmp_path / "a.m4a", 2.0, "-c:a", "aac")
    async with (
        running_server(tiny_whisper) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        for name, audio, kind in (("a.ogg", ogg, "audio/ogg"), ("a.m4a", m4a, "audio/mp4")):
            reply = await http.post(
                "/v1/audio/transcriptions",
                data={"model": "tiny", "response_format": "verbose_json"},
                files={"file": (name, audio, kind)},
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["duration"] == pytest.approx(2.0, abs=0.05)  # decoded length
        corrupt = await http.post(
            "/v1/audio/transcriptions",
            data={"model": "tiny"},
            files={"file": ("a.ogg", b"OggS" + bytes(200), "audio/ogg")},
        )
        assert corrupt.status_code == 400
        validate_error(corrupt.json())
        assert corrupt.json()["error"]["code"] == "invalid_audio"
        assert (await http.get("/health")).status_code == 200
        assert speech_engine(server).statistics().lanes_borrowed == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_disconnect_stops_the_transcription_between_tokens(
    tiny_whisper: Path, stream: bool
) -> None:
    async with running_server(tiny_whisper) as server:
        engine = speech_engine(server)
        fields = {"model": "tiny", "temperature": "0.5", **({"stream": "true"} if stream else {})}
        request = multipart_request("/v1/audio/transcriptions", fields, wav_bytes(clip(65)))
        connection = await raw_http(port_of(server), request)
        if stream:
            await read_until(connection, b"data: ")  # the first window's text is out
        else:
            await eventually(lambda: engine.statistics().tokens_decoded > 0, "decoding")
        await connection.aclose()
        # The lane returns with the thread's confirmation that the transcription ended.
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane is back")
        stats = engine.statistics()
        assert stats.cancelled == 1 and not stats.running
        assert stats.windows_decoded < 3, "the disconnected transcription ran on"  # of 3+

        # The next request is served whole.
        reply = await sdk(server).audio.transcriptions.create(
            model="tiny", file=("a.wav", CLIP, "audio/wav"), response_format="verbose_json"
        )
        assert reply.duration == pytest.approx(2.0)


async def test_the_deadline_stops_a_long_transcription(tiny_whisper: Path) -> None:
    async with (
        running_server(tiny_whisper, request_timeout=1.0) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        engine = speech_engine(server)
        reply = await http.post(
            "/v1/audio/transcriptions",
            data={"model": "tiny"},
            files={"file": ("a.wav", wav_bytes(clip(185)), "audio/wav")},
        )
        assert reply.status_code == 504 and reply.headers["x-should-retry"] == "false"
        validate_error(reply.json())
        stats = engine.statistics()
        assert stats.cancelled == 1 and stats.lanes_borrowed == 0 and not stats.running
        assert stats.windows_decoded < 7, "the transcription ran past its deadline"
        assert json.loads(reply.text)["error"]["code"] == "request_timeout"
        assert RATE == 16_000


async def test_shutdown_stops_a_transcription_with_a_final_event(tiny_whisper: Path) -> None:
    async with running_server(tiny_whisper, shutdown_grace=0.2) as server:
        fields = {"model": "tiny", "temperature": "0.5", "stream": "true"}
        request = multipart_request("/v1/audio/transcriptions", fields, wav_bytes(clip(95)))
        connection = await raw_http(port_of(server), request)
        await read_until(connection, b"data: ")  # the first window's text is out
        engine = speech_engine(server)
    # The block's end shut the server down: the grace passed, the job was cancelled, the
    # stream ended with the shutdown error, and the speech thread has been joined.
    rest = await read_until(connection, b"server_shutting_down")
    assert b"transcript.text.done" not in rest
    stats = engine.statistics()
    assert stats.cancelled == 1 and stats.lanes_borrowed == 0 and stats.state == "closed"
    assert SPEECH_THREAD_NAME not in [t.name for t in threading.enumerate()]


async def test_a_cancel_by_id_stops_a_transcription(tiny_whisper: Path) -> None:
    async with (
        running_server(tiny_whisper) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        engine = speech_engine(server)
        replies: list[httpx.Response] = []

        async def transcribe() -> None:
            audio = ("a.wav", wav_bytes(clip(65)), "audio/wav")
            headers = {"x-request-id": "speech-1"}
            reply = await http.post(
                "/v1/audio/transcriptions", data={"model": "tiny"}, files={"file": audio},
                headers=headers,
            )  # fmt: skip
            replies.append(reply)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(transcribe)
            await eventually(lambda: engine.statistics().tokens_decoded > 0, "decoding")
            assert (await http.post("/v1/requests/speech-1/cancel")).status_code == 200
        [reply] = replies
        assert reply.status_code == 409 and reply.headers["x-should-retry"] == "false"
        validate_error(reply.json())
        assert reply.json()["error"]["code"] == "request_cancelled"
        stats = engine.statistics()
        assert stats.cancelled == 1 and stats.lanes_borrowed == 0 and not stats.running
        assert stats.windows_decoded < 3, "the cancelled transcription ran on"  # of 3+
