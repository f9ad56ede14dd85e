"""Speech's compressed formats over HTTP with the tiny KittenTTS (`make-model --preset tiny-tts`):
mp3, opus, aac and flac encoded in process a sentence at a time (decisions/0050), through the
official SDK's streaming response and raw sockets against a real Hypercorn server: each decodes
to the audio's duration, the first bytes leave while the synthesis runs, and a disconnect or
a failing encoder stops the synthesis."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from mlx_nursery.testing import injected_fault
from tests.http.test_http_speech import RATE, THREE, decoded, synthesis_engine
from tests.http_helpers import eventually, port_of, post_request, raw_http, running_server, sdk

FORTY = " ".join(f"Sentence number {i} is here." for i in range(40))
COMPRESSED = {  # format: its Content-Type, the container PyAV finds, the rate it decodes at
    "mp3": ("audio/mpeg", "mp3", RATE),
    "opus": ("audio/ogg", "ogg", 48_000),  # Opus decodes at 48 kHz, whatever it was made at
    "aac": ("audio/aac", "aac", RATE),
    "flac": ("audio/flac", "flac", RATE),
}
PADDING = 2048
"""Samples at 24 kHz a codec may add: LAME's and AAC's encoder delay and the last frame's
padding (two AAC frames; Ogg Opus and FLAC mark their exact length)."""


async def test_each_compressed_format_streams_audio_that_decodes(tiny_tts: Path) -> None:
    """mp3, opus, aac and flac through the SDK's streaming response, raw and as sse events:
    each decodes (PyAV) to the pcm answer's duration, within the codec's padding, at its
    codec's rate. An encoder that fails midway cuts the transfer and stops the synthesis."""
    async with running_server(None, model=(f"{tiny_tts}=tts",), skip_warmup=True) as server:
        client = sdk(server)
        said: dict[str, Any] = {"model": "tts", "input": THREE, "voice": "fable"}
        pcm = await client.audio.speech.create(**said, response_format="pcm")
        seconds = len(pcm.content) / 2 / RATE
        for audio_format, (content_type, container, rate) in COMPRESSED.items():
            async with client.audio.speech.with_streaming_response.create(
                **said, response_format=audio_format
            ) as streamed:
                assert streamed.headers["content-type"] == content_type
                data = b"".join([piece async for piece in streamed.iter_bytes()])
            name, decoded_rate, samples = decoded(data)
            assert (name, decoded_rate) == (container, rate), audio_format
            assert 0 <= samples / rate - seconds <= PADDING / RATE, (audio_format, samples)
            # The same audio base64 in sse events; OpenAI's own sse example names no format
            # and gets its default, mp3.
            chosen = {} if audio_format == "mp3" else {"response_format": audio_format}
            async with client.audio.speech.with_streaming_response.create(
                **said, **chosen, stream_format="sse"
            ) as events_response:
                lines = [line async for line in events_response.iter_lines()]
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
            assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}, audio_format
            assert events[-1]["type"] == "speech.audio.done" and len(events) > 2
            audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
            name, decoded_rate, samples = decoded(audio)
            assert (name, decoded_rate) == (container, rate), ("sse", audio_format)
            assert 0 <= samples / rate - seconds <= PADDING / RATE, ("sse", audio_format)

        engine = synthesis_engine(server)
        before = engine.statistics()
        body = {"model": "tts", "input": FORTY, "voice": "alloy", "response_format": "flac"}
        request = post_request("/v1/audio/speech", body)
        request = request.replace(b"\r\n\r\n", b"\r\nx-request-id: fault-encode\r\n\r\n", 1)
        with injected_fault("speech_encoding", "fault-encode"):
            connection = await raw_http(port_of(server), request)
            async with connection:
                raw = b""
                while chunk := await connection.receive_some(65536):
                    raw += chunk
        assert raw.startswith(b"HTTP/1.1 200") and not raw.endswith(b"\r\n0\r\n\r\n")
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane is back")
        after = engine.statistics()
        assert after.cancelled == before.cancelled + 1
        assert after.chunks_synthesized - before.chunks_synthesized < 40


async def test_an_mp3_streams_as_it_is_made_and_a_disconnect_stops_it(tiny_tts: Path) -> None:
    """The first mp3 bytes reach the SDK while the synthesis still runs (its counters show
    it mid-way: nothing waits for the whole audio); closing the response stops it."""
    async with running_server(None, model=(f"{tiny_tts}=tts",), skip_warmup=True) as server:
        engine = synthesis_engine(server)
        async with sdk(server).audio.speech.with_streaming_response.create(
            model="tts", input=FORTY, voice="alloy", response_format="mp3"
        ) as streamed:
            first = await anext(streamed.iter_bytes())
            midway = engine.statistics()
        assert first[:3] == b"ID3" or first[:2] == b"\xff\xf3", first[:4]
        assert midway.running and midway.chunks_synthesized < 40, midway
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane is back")
        stats = engine.statistics()
        assert stats.cancelled == 1 and not stats.running
        assert stats.chunks_synthesized < 40, "the disconnected synthesis ran on"
