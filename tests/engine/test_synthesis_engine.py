"""The synthesis engine on the tiny KittenTTS, without HTTP: its chunks come a sentence at a
time and add up to `Synthesized`; a closed engine refuses a waiting synthesis at once; a
full queue is refused; a TTS model whose phonemizer is missing does not load, and says what
to install."""

from __future__ import annotations

import importlib.util
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

from mlx_nursery.engine import (
    SYNTHESIS_THREAD_NAME,
    AudioChunk,
    EngineOverloaded,
    EngineUnavailable,
    SynthesisConfig,
    SynthesisEngine,
    SynthesisRequest,
    Synthesized,
)
from mlx_nursery.models import ModelLoadError

LONG = " ".join(f"Sentence number {i} is here." for i in range(100))


async def test_chunks_come_a_sentence_at_a_time_and_add_up(tiny_tts: Path) -> None:
    async with trio.open_nursery() as nursery:
        engine: SynthesisEngine = await nursery.start(
            SynthesisEngine(SynthesisConfig(tiny_tts)).run
        )
        assert engine.info.voices == ("alloy", "echo", "fable", "nova")
        async with engine.synthesize(SynthesisRequest("One. Two, two! Three?", "echo")) as events:
            received = [event async for event in events]
        chunks = [e for e in received if isinstance(e, AudioChunk)]
        assert len(chunks) == 3 and isinstance(received[-1], Synthesized)
        end = received[-1]
        assert end.chunks == 3 and end.samples == sum(len(c.samples) for c in chunks)
        assert all(c.sample_rate == 24_000 and np.isfinite(c.samples).all() for c in chunks)
        stats = engine.statistics()
        assert stats.chunks_synthesized == 3 and stats.lanes_borrowed == 0 and stats.cancelled == 0
        engine.close()


async def test_close_refuses_a_waiting_synthesis_and_a_full_queue_is_refused(
    tiny_tts: Path,
) -> None:
    refusals: list[int] = []  # lanes borrowed when the queued one was refused
    refused = trio.Event()
    async with trio.open_nursery() as nursery:
        config = SynthesisConfig(tiny_tts, max_queue=1)
        engine: SynthesisEngine = await nursery.start(SynthesisEngine(config).run)

        async def queued() -> None:
            try:
                async with engine.synthesize(SynthesisRequest("Hi.", "alloy")):
                    pass
            except EngineUnavailable:
                refusals.append(engine.statistics().lanes_borrowed)
            refused.set()

        async with engine.synthesize(SynthesisRequest(LONG, "alloy")) as events:
            await events.receive()  # the first sentence is made
            nursery.start_soon(queued)
            await trio.testing.wait_all_tasks_blocked()
            assert engine.statistics().queued == 1
            with pytest.raises(EngineOverloaded):  # the queue (1) is full: refused at once
                async with engine.synthesize(SynthesisRequest("Hi.", "alloy")):
                    pass
            engine.close()
            await refused.wait()
            assert refusals == [1]  # refused while the long one still runs
        # Leaving the block stopped the long one before its next sentence; the thread exited.
        stats = engine.statistics()
        assert stats.lanes_borrowed == 0 and stats.cancelled == 1 and stats.chunks_synthesized < 100
    assert engine.statistics().state == "closed"
    assert SYNTHESIS_THREAD_NAME not in [t.name for t in threading.enumerate()]


async def test_a_model_without_its_phonemizer_does_not_load(tiny_tts: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("phonemizer") is not None:
        pytest.skip("phonemizer is installed here")
    real = shutil.copytree(tiny_tts, tmp_path / "kitten")
    config = json.loads((real / "config.json").read_text())
    del config["mlx_nursery_g2p"]  # a real KittenTTS: espeak phonemizes its text
    (real / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(SynthesisEngine(SynthesisConfig(real)).run)
    assert raised.group_contains(ModelLoadError, match="pip install phonemizer-fork")
    assert SYNTHESIS_THREAD_NAME not in [t.name for t in threading.enumerate()]
