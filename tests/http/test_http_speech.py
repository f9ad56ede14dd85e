"""Speech synthesis over HTTP with the tiny random-weight KittenTTS (`make-model --preset
tiny-tts`): the official SDK, httpx and raw sockets against a real Hypercorn server. wav and
pcm bodies, the audio streamed a sentence per chunk, OpenAI's sse events, the model card's
voices, 400s in the envelope, and a disconnect that stops the synthesis thread. The
compressed formats' own tests are test_http_speech_formats.py's."""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
from pathlib import Path
from typing import Any

import av
import httpx
import pytest

from mlx_nursery.engine import SYNTHESIS_THREAD_NAME, SynthesisEngine
from mlx_nursery.testing import injected_fault
from tests.http.test_http_metrics import samples, value
from tests.http_helpers import (
    eventually,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
    sdk,
    validate_error,
)

RATE = 24_000
THREE = "One. Two, two. Three, three, three."


def synthesis_engine(server: Any, name: str = "tts") -> SynthesisEngine:
    slot = server.service.models.find(name)
    assert slot.hosted is not None and slot.hosted.synthesis is not None
    engine: SynthesisEngine = slot.hosted.synthesis
    return engine


def wav_parts(data: bytes) -> tuple[int, int, bytes]:
    """A 16-bit mono WAV's rate, its data chunk's stated size, and its samples' bytes."""
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", data[20:36])
    assert (tag, channels, bits) == (1, 1, 16) and data[36:40] == b"data"
    return rate, struct.unpack("<I", data[40:44])[0], data[44:]


def decoded(data: bytes) -> tuple[str, int, int]:
    """What PyAV finds in `data`: its container's name, its audio's rate and sample count."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = list(container.decode(stream))
        name = container.format.name
    assert frames and len({f.sample_rate for f in frames}) == 1
    return name, frames[0].sample_rate, sum(f.samples for f in frames)


def dechunked(raw: bytes) -> list[bytes]:
    """The chunks of a chunked HTTP/1.1 body (what the server wrote, one piece at a time)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    chunks = []
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return chunks
        chunks.append(body[:size])
        body = body[size + 2 :]


async def test_wav_pcm_sse_and_the_card_through_the_sdk(tiny_tts: Path, tiny_model: Path) -> None:
    async with running_server(
        None, model=(f"{tiny_tts}=tts", f"{tiny_model}=chat"), max_loaded_models=2, skip_warmup=True
    ) as server:
        client = sdk(server)
        cards = {m.id: m.model_extra for m in (await client.models.list()).data}
        assert cards["tts"] is not None and cards["chat"] is not None
        assert cards["tts"]["kind"] == "speech-synthesis" and cards["tts"]["input_modalities"] == [
            "text"
        ]
        assert cards["tts"]["voices"] == ["alloy", "echo", "fable", "nova"]
        assert "voices" not in cards["chat"]

        wav = await client.audio.speech.create(
            model="tts", input="Hello there.", voice="alloy", response_format="wav"
        )
        rate, stated, pcm = wav_parts(wav.content)
        assert rate == RATE and stated == 0xFFFFFFFF, "streamed: its length is unknown up front"
        assert len(pcm) > 0 and len(pcm) % 2 == 0

        # pcm: the same samples without a header; more text, more audio.
        short = await client.audio.speech.create(
            model="tts", input="Hello there.", voice="alloy", response_format="pcm"
        )
        assert len(short.content) == len(pcm)
        longer = await client.audio.speech.create(
            model="tts", input="Hello there, my good friend.", voice="echo", response_format="pcm"
        )
        assert len(longer.content) > len(short.content)
        slower = await client.audio.speech.create(
            model="tts", input="Hello there.", voice="alloy", response_format="pcm", speed=0.5
        )
        assert len(slower.content) > len(short.content)

        # No format named: OpenAI's mp3.
        plain = await client.audio.speech.create(model="tts", input="Hi.", voice="nova")
        assert plain.response.headers["content-type"] == "audio/mpeg"
        assert decoded(plain.content)[0] == "mp3"

        # The streaming response: the same bytes as a whole answer.
        async with client.audio.speech.with_streaming_response.create(
            model="tts", input=THREE, voice="fable", response_format="pcm"
        ) as streamed:
            pieces = [piece async for piece in streamed.iter_bytes()]
        whole = await client.audio.speech.create(
            model="tts", input=THREE, voice="fable", response_format="pcm"
        )
        assert len(b"".join(pieces)) == len(whole.content)

        # sse: a delta per sentence, then done; the deltas add up to the pcm answer.
        async with client.audio.speech.with_streaming_response.create(
            model="tts", input=THREE, voice="fable", response_format="pcm", stream_format="sse"
        ) as events_response:
            assert events_response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in events_response.iter_lines()]
        events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
        assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
        audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        assert len(audio) == len(whole.content)
        usage = events[-1]["usage"]
        assert usage["input_tokens"] > 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]

        # Each kind of model refuses the other's route, in the envelope.
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            wrong = await http.post(
                "/v1/audio/speech", json={"model": "chat", "input": "Hi.", "voice": "alloy"}
            )
            assert wrong.status_code == 400 and wrong.json()["error"]["code"] == (
                "model_not_supported"
            )
            validate_error(wrong.json())
            refused = await http.post(
                "/v1/chat/completions",
                json={"model": "tts", "messages": [{"role": "user", "content": "Hi"}]},
            )
            assert (
                refused.status_code == 400
                and "/v1/audio/speech" in refused.json()["error"]["message"]
            )
            metrics = samples((await http.get("/metrics")).text)
        counted = value(
            metrics, "mlx_nursery:http_requests_total", route="/v1/audio/speech", status="200"
        )
        assert counted == 8
        assert (
            value(
                metrics, "mlx_nursery:http_requests_total", route="/v1/audio/speech", status="400"
            )
            == 1
        )


async def test_a_stream_writes_a_chunk_per_sentence(tiny_tts: Path) -> None:
    async with running_server(None, model=(f"{tiny_tts}=tts",), skip_warmup=True) as server:
        body = {"model": "tts", "input": THREE, "voice": "alloy", "response_format": "wav"}
        connection = await raw_http(port_of(server), post_request("/v1/audio/speech", body))
        async with connection:
            raw = await read_until(connection, b"\r\n0\r\n\r\n")
        chunks = dechunked(raw)
        assert len(chunks) == 4, "the wav header, then one chunk per sentence"
        assert wav_parts(chunks[0] + b"")[0] == RATE and all(chunks[1:])
        assert synthesis_engine(server).statistics().chunks_synthesized == 3

        # mp3 too: what each sentence's frames, then what the encoder kept back.
        body["response_format"] = "mp3"
        connection = await raw_http(port_of(server), post_request("/v1/audio/speech", body))
        async with connection:
            raw = await read_until(connection, b"\r\n0\r\n\r\n")
        chunks = dechunked(raw)
        assert len(chunks) == 4, "one chunk per sentence, then the encoder's rest"
        assert decoded(b"".join(chunks))[0] == "mp3"


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"voice": "shimmer"}, "voice", "shimmer"),
    ({"response_format": "ogg"}, "response_format", "ogg"),
    ({"speed": 9}, "speed", "speed"),
    ({"input": ""}, "input", "empty"),
    ({"stream_format": "sse", "response_format": "wave"}, "response_format", "wave"),
    ({"instructions": "cheerful"}, "instructions", "instructions"),
    ({"surprise": 1}, "surprise", "surprise"),
]


async def test_bad_fields_are_400s_in_the_envelope(tiny_tts: Path) -> None:
    cases = list(BAD)
    async with (
        running_server(None, model=(f"{tiny_tts}=tts",), skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        for change, param, named in cases:
            body = {"model": "tts", "input": "Hi.", "voice": "alloy"} | change
            reply = await http.post("/v1/audio/speech", json=body)
            assert reply.status_code == 400, (change, reply.text)
            validate_error(reply.json())
            error = reply.json()["error"]
            assert error["param"] == param and named in error["message"], (change, error)
        assert synthesis_engine(server).statistics().chunks_synthesized == 0

        # A failure on the synthesis thread fails its request alone, in the envelope.
        body = {"model": "tts", "input": "Hi.", "voice": "alloy", "response_format": "pcm"}
        with injected_fault("synthesis_chunk", "fault-tts"):
            failed = await http.post(
                "/v1/audio/speech", json=body, headers={"x-request-id": "fault-tts"}
            )
            assert failed.status_code >= 500
            validate_error(failed.json())
            assert failed.json()["error"]["code"] == "synthesis_failed"
            ok = await http.post("/v1/audio/speech", json=body)
            assert ok.status_code == 200 and len(ok.content) > 0


async def test_a_disconnect_stops_the_synthesis_between_sentences(tiny_tts: Path) -> None:
    sentences = 40
    text = " ".join(f"Sentence number {i} is here." for i in range(sentences))
    async with running_server(None, model=(f"{tiny_tts}=tts",), skip_warmup=True) as server:
        engine = synthesis_engine(server)
        body = {"model": "tts", "input": text, "voice": "alloy", "response_format": "pcm"}
        connection = await raw_http(port_of(server), post_request("/v1/audio/speech", body))
        await read_until(connection, b"\r\n\r\n")  # the headers: the first sentence is out
        await connection.aclose()
        # The lane returns with the thread's confirmation that the synthesis ended.
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane is back")
        stats = engine.statistics()
        assert stats.cancelled == 1 and not stats.running
        assert stats.chunks_synthesized < sentences, "the disconnected synthesis ran on"

        # The next request is served whole.
        reply = await sdk(server).audio.speech.create(
            model="tts", input="Hi.", voice="alloy", response_format="pcm"
        )
        assert len(reply.content) > 0


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
async def test_a_failure_midway_cuts_raw_audio_and_ends_sse_with_an_error(
    tiny_tts: Path, stream_format: str
) -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    async with running_server(  # unharnessed: the server's own cut, not the test harness's
        None, model=(f"{tiny_tts}=tts",), skip_warmup=True, harnessed=False
    ) as server:
        body = {"model": "tts", "input": text, "voice": "alloy", "stream_format": stream_format}
        request = post_request("/v1/audio/speech", body)
        label = "fault-midway"
        request = request.replace(b"\r\n\r\n", f"\r\nx-request-id: {label}\r\n\r\n".encode(), 1)
        connection = await raw_http(port_of(server), request)
        async with connection:
            head = await read_until(connection, b"\r\n\r\n")  # the first sentence is out
            assert head.startswith(b"HTTP/1.1 200")
            with injected_fault("synthesis_chunk", label):  # a later sentence fails
                if stream_format == "sse":  # to its last chunk (the connection stays open)
                    raw = head + await read_until(connection, b"\r\n0\r\n\r\n")
                else:  # to the connection's end
                    raw = head
                    while chunk := await connection.receive_some(65536):
                        raw += chunk
        engine = synthesis_engine(server)
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane is back")
        assert engine.statistics().chunks_synthesized < 40
        if stream_format == "sse":  # the stream ends with an error event, whole
            events = [
                json.loads(line[len("data: ") :])
                for line in b"".join(dechunked(raw)).decode().split("\n")
                if line.startswith("data: ")
            ]
            assert events[0]["type"] == "speech.audio.delta"
            assert events[-1]["error"]["code"] == "synthesis_failed"
        else:  # the transfer is cut: no last chunk, so no client takes it for a whole file
            assert not raw.endswith(b"\r\n0\r\n\r\n")


async def test_shutdown_stops_a_synthesis_with_a_final_event(tiny_tts: Path) -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(100))
    async with running_server(
        None, model=(f"{tiny_tts}=tts",), skip_warmup=True, shutdown_grace=0.2
    ) as server:
        body = {"model": "tts", "input": text, "voice": "alloy", "stream_format": "sse"}
        connection = await raw_http(port_of(server), post_request("/v1/audio/speech", body))
        await read_until(connection, b"data: ")  # the first sentence is out
        engine = synthesis_engine(server)
    # The block's end shut the server down: the grace passed, the job was cancelled, the
    # stream ended with the shutdown error, and the synthesis thread has been joined.
    rest = await read_until(connection, b"server_shutting_down")
    assert b"speech.audio.done" not in rest
    stats = engine.statistics()
    assert stats.cancelled == 1 and stats.lanes_borrowed == 0 and stats.state == "closed"
    assert stats.chunks_synthesized < 100
    assert SYNTHESIS_THREAD_NAME not in [t.name for t in threading.enumerate()]


async def test_a_cancel_by_id_stops_a_synthesis(tiny_tts: Path) -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(100))
    async with (
        running_server(None, model=(f"{tiny_tts}=tts",), skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        engine = synthesis_engine(server)
        body = {"model": "tts", "input": text, "voice": "alloy", "stream_format": "sse"}
        request = post_request("/v1/audio/speech", body)
        request = request.replace(b"\r\n\r\n", b"\r\nx-request-id: speech-1\r\n\r\n", 1)
        connection = await raw_http(port_of(server), request)
        async with connection:
            await read_until(connection, b"data: ")  # the first sentence is out
            assert (await http.post("/v1/requests/speech-1/cancel")).status_code == 200
            rest = await read_until(connection, b"request_cancelled")
        assert b"speech.audio.done" not in rest
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane is back")
        stats = engine.statistics()
        assert stats.cancelled == 1 and not stats.running and stats.chunks_synthesized < 100


async def test_the_deadline_stops_a_synthesis_between_sentences(tiny_tts: Path) -> None:
    """--request-timeout bounds a synthesis as it bounds a generation: past it, the stream
    ends with a `request_timeout` error event (no done) and the thread stops before its next
    sentence, its lane back."""
    sentences = 600
    text = " ".join(["Hi."] * sentences)
    async with running_server(
        None, model=(f"{tiny_tts}=tts",), skip_warmup=True, request_timeout=0.5
    ) as server:
        engine = synthesis_engine(server)
        body = {"model": "tts", "input": text, "voice": "alloy", "stream_format": "sse"}
        connection = await raw_http(port_of(server), post_request("/v1/audio/speech", body))
        async with connection:
            raw = await read_until(connection, b"request_timeout")
        assert b"speech.audio.delta" in raw and b"speech.audio.done" not in raw
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane is back")
        stats = engine.statistics()
        assert stats.cancelled == 1 and not stats.running
        assert stats.chunks_synthesized < sentences, "the synthesis ran past its deadline"
