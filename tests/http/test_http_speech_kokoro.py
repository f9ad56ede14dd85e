"""Kokoro through the real server (`make-model --preset tiny-kokoro`: mlx-audio's Kokoro,
random weights, its letters as phonemes): its English voices on the card and the only ones
taken, wav through the SDK, and sse a sentence per event at half speed. Few and short
syntheses: Kokoro's decoder is 56M parameters at any size (`tools/_presets.py`)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx

from tests.http.test_http_speech import RATE, synthesis_engine, wav_parts
from tests.http_helpers import running_server, sdk, validate_error

VOICES = ["af_alloy", "am_echo", "bf_fable", "bm_nova"]


async def test_kokoro_speaks_its_english_voices_through_the_sdk(tiny_kokoro: Path) -> None:
    async with (
        running_server(None, model=(f"{tiny_kokoro}=kokoro",), skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        client = sdk(server)
        card = (await client.models.retrieve("kokoro")).model_extra
        assert card is not None and card["kind"] == "speech-synthesis"
        assert card["voices"] == VOICES, "English voices only: ef_dora is not served"

        refusal = {"model": "kokoro", "input": "Hi.", "voice": "alloy"}
        for voice in ("alloy", "ef_dora"):
            refused = await http.post("/v1/audio/speech", json=refusal | {"voice": voice})
            assert refused.status_code == 400, refused.text
            validate_error(refused.json())
            assert refused.json()["error"]["param"] == "voice"
            assert "af_alloy" in refused.json()["error"]["message"]
        wav = await client.audio.speech.create(
            model="kokoro", input="Hi.", voice="af_alloy", response_format="wav"
        )
        rate, _, pcm = wav_parts(wav.content)
        assert rate == RATE and len(pcm) > 0
        body = {
            "model": "kokoro",
            "input": "Hi. Yo.",
            "voice": "bf_fable",
            "response_format": "pcm",
        }
        async with http.stream(
            "POST", "/v1/audio/speech", json=body | {"stream_format": "sse", "speed": 0.5}
        ) as events_response:
            lines = [line async for line in events_response.aiter_lines()]
        events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
        assert [e["type"] for e in events] == ["speech.audio.delta"] * 2 + ["speech.audio.done"]
        audio = [base64.b64decode(e["audio"]) for e in events[:-1]]
        assert len(audio[0]) > len(pcm), "speed 0.5 lengthens every phoneme of 'Hi.'"
        assert len(audio[1]) > 0
        assert events[-1]["usage"]["input_tokens"] == len("Hi.") + len("Yo.")

        stats = synthesis_engine(server, "kokoro").statistics()
        assert stats.chunks_synthesized == 3 and stats.lanes_borrowed == 0
