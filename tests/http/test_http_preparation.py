"""One client cannot stall every other: attacks on request preparation through a real server.

Each attack is either refused before its work (a 400 naming the limit) or runs while a
victim, another client's 1-token chat on the same server, is served.
"""

from __future__ import annotations

import base64
import struct
import threading
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from mlx_nursery.serving import PREPARE_THREADS
from tests.http.test_http_audio import multipart_request
from tests.http_helpers import (
    chat_body,
    eventually,
    port_of,
    raw_http,
    running_server,
    validate_error,
)
from tests.speech_helpers import clip, flac_bytes, wav_bytes

EMPTY_REASONING = {"type": "reasoning", "summary": []}
_SOLID_WEBP = bytes.fromhex(
    "524946461e000000574542505650384c110000002f3fdfe10407508a2ad4a3ff8188e87f0000"
)
"""A lossless WebP of one colour: 38 bytes whatever its size (8000 x 5000 here)."""


def solid_webp(width: int, height: int) -> str:
    """A data URL of a one-colour WebP of `width` x `height` pixels, 38 bytes long (a
    decompression bomb: 40 megapixels take seconds and 120 MB to decode)."""
    head = struct.unpack("<I", _SOLID_WEBP[21:25])[0]
    size = (head & ~((1 << 28) - 1)) | (width - 1) | ((height - 1) << 14)
    data = _SOLID_WEBP[:21] + struct.pack("<I", size) + _SOLID_WEBP[25:]
    return "data:image/webp;base64," + base64.b64encode(data).decode()


BOMB = solid_webp(8000, 5000)


def image_chat(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What?"}]}],
        "max_tokens": 1,
        "temperature": 0,
    }


async def victim_served(http: httpx.AsyncClient, model: str = "tiny") -> None:
    """Another client's 1-token chat is answered."""
    body = chat_body(max_tokens=1, temperature=0, model=model)
    reply = await http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 1


@attrs.define
class Holds:
    """Holds open the preparation of each request whose `user` is "hold" until released: a
    preparation as slow as the test wants (the server's test-only `extra_processors` hook
    runs on the preparation thread)."""

    entered: threading.Semaphore = attrs.field(factory=lambda: threading.Semaphore(0))
    release: threading.Event = attrs.field(factory=threading.Event)

    def __call__(self, body: Any) -> tuple[Any, ...]:
        if isinstance(body, dict) and body.get("user") == "hold":
            self.entered.release()
            assert self.release.wait(60), "the test never released the preparation"
        return ()


async def test_slow_preparations_do_not_hold_up_another(tiny_model: Path) -> None:
    """Every request was prepared on one thread, so one slow preparation delayed every other
    client's. Now each slow one holds one of `PREPARE_THREADS`: with all but one held open,
    another client's chat is prepared and answered meanwhile."""
    held = PREPARE_THREADS - 1
    assert held >= 1
    holds = Holds()
    replies: list[httpx.Response] = []
    async with (
        running_server(tiny_model, extra_processors=holds, skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):

        async def slow() -> None:
            body = chat_body(max_tokens=1, temperature=0, user="hold")
            replies.append(await http.post("/v1/chat/completions", json=body))

        async with trio.open_nursery() as nursery:
            for _ in range(held):
                nursery.start_soon(slow)
            for _ in range(held):
                assert await trio.to_thread.run_sync(holds.entered.acquire, True, 60)
            assert server.parts.preparation.preparing == held
            await victim_served(http)  # while the others are still held
            assert not replies
            holds.release.set()
    assert [r.status_code for r in replies] == [200] * held


def responses_attack(reasoning_items: int, last: dict[str, Any]) -> dict[str, Any]:
    """A Responses input of empty reasoning items (they add no message), then `last`."""
    return {
        "model": "tiny",
        "input": [EMPTY_REASONING] * reasoning_items + [last],
        "max_output_tokens": 1,
        "temperature": 0,
    }


async def test_responses_input_items_are_counted_before_they_are_read(tiny_model: Path) -> None:
    """Empty reasoning items add no message, so the message limit alone never tripped, and
    naming each message's item re-read the input once per item (quadratic). Items now count
    against --max-messages in the raw body, and within it the input is read in one pass.
    The Messages API's messages count against it too."""
    user = {"role": "user", "content": "Hi"}
    async with (
        running_server(tiny_model, max_messages=15_000) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        refused = await http.post("/v1/responses", json=responses_attack(15_000, user))
        assert refused.status_code == 400
        validate_error(refused.json())
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("too_many_items", "input")
        messages = [{"role": "user", "content": "Hi"}] * 15_001
        anthropic = {"model": "tiny", "max_tokens": 1, "messages": messages}
        refused = await http.post("/v1/messages", json=anthropic)
        assert refused.status_code == 400
        assert refused.json()["error"]["message"].startswith("messages holds 15001 items")
        await victim_served(http)

        # Within the limit: prepared, and an error still names the item its message came from.
        taken = await http.post("/v1/responses", json=responses_attack(12_000, user))
        assert taken.status_code == 200, taken.text
        image = {"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}
        named = await http.post("/v1/responses", json=responses_attack(12_000, image))
        assert named.status_code == 400
        assert named.json()["error"]["param"] == "input[12000].content[0].type"
        await victim_served(http)


async def test_image_pixels_are_bounded_per_image_and_per_request(tiny_vlm: Path) -> None:
    """Sixteen 40-megapixel WebPs (a 35 KB request) held the preparation thread for 23 s and
    took memory to 5 GB. Each image's pixels are read from its header and checked, against
    the per-image limit (its default here) and what the request's earlier images left,
    before it is decoded."""
    small = solid_webp(100, 100)
    async with (
        running_server(tiny_vlm, max_image_pixels_per_request=25_000, skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        bombs = await http.post("/v1/chat/completions", json=image_chat(*[BOMB] * 16))
        assert bombs.status_code == 400
        validate_error(bombs.json())
        error = bombs.json()["error"]
        assert error["code"] == "image_too_large" and "8000x5000" in error["message"]
        assert "(--max-image-pixels)" in error["message"]
        assert error["param"] == "messages[0].content[0].image_url.url"
        await victim_served(http)

        two = await http.post("/v1/chat/completions", json=image_chat(small, small))
        assert two.status_code == 200, two.text
        three = await http.post("/v1/chat/completions", json=image_chat(small, small, small))
        assert three.status_code == 400
        error = three.json()["error"]
        assert (error["code"], error["param"]) == (
            "image_too_large",
            "messages[0].content[2].image_url.url",
        )
        assert "--max-image-pixels-per-request" in error["message"]


HOUR = 3600
AUDIO_ATTACKS: list[tuple[str, bytes, str, str]] = [
    # what, the file, the code, words of the message
    ("a 124-byte WAV at 1 Hz", wav_bytes(clip(0.0025), rate=1), "invalid_audio", "1 Hz"),
    ("655,350 Hz x 8 FLAC", flac_bytes(655_350, 8, 655_350 * 120), "invalid_audio", "Hz"),
    ("9 channels", wav_bytes(clip(0.1), channels=9), "invalid_audio", "9 channels"),
    ("11 hours of silence", flac_bytes(48_000, 2, 48_000 * 11 * HOUR), "audio_too_long", "longer"),
    ("384 kHz x 8 for 20 min", flac_bytes(384_000, 8, 384_000 * 1200), "audio_too_long", "samples"),
]


async def test_audio_limits_are_read_from_the_header_and_decoding_stops_with_its_client(
    tiny_whisper: Path, tiny_model: Path
) -> None:
    """A 124-byte WAV at 1 Hz built a resampling filter of millions of taps (a vision chat
    waited 33 s after the client left); a 42 KB FLAC at 655,350 Hz x 8 channels decoded for
    15 s. Rate, channels, duration and samples are checked from the header before decoding
    (an odd rate within them: tests/generation/test_audio_unit.py), and decoding within the
    limits (10 hours allowed here) stops at its next second once the client has gone."""
    async with (
        running_server(
            None,
            model=(f"{tiny_whisper}=whisper", f"{tiny_model}=tiny"),
            max_loaded_models=2,
            skip_warmup=True,
            max_audio_seconds=10 * HOUR,
        ) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):

        async def transcribe(audio: bytes) -> httpx.Response:
            files = {"file": ("a.wav", audio, "audio/wav")}
            fields = {"model": "whisper", "temperature": "0.5"}
            return await http.post("/v1/audio/transcriptions", data=fields, files=files)

        assert len(AUDIO_ATTACKS[0][1]) == 124 and len(AUDIO_ATTACKS[1][1]) < 42_000
        for what, audio, code, words in AUDIO_ATTACKS:
            reply = await transcribe(audio)
            assert reply.status_code == 400, (what, reply.text)
            validate_error(reply.json())
            error = reply.json()["error"]
            assert (error["code"], error["param"]) == (code, "file"), what
            assert words in error["message"], (what, error)
        await victim_served(http)

        # Ten hours of 48 kHz stereo FLAC, within the limits: its client leaves while it
        # decodes, and the thread stops (its slot comes back) at its next second of audio.
        fields = {"model": "whisper"}
        request = multipart_request(
            "/v1/audio/transcriptions", fields, flac_bytes(48_000, 2, 48_000 * 10 * HOUR)
        )
        preparation = server.parts.preparation
        connection = await raw_http(port_of(server), request)
        await eventually(lambda: preparation.preparing == 1, "the audio is being prepared")
        await connection.aclose()
        await eventually(lambda: preparation.preparing == 0, "the preparation stopped")
        await victim_served(http)
