"""The speech runtime on a real (tiny, random-weight) Whisper: the same transcript as
mlx-audio's own `generate`, stopped within a token, one thread, lanes returned."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from mlx_nursery.engine import (
    SPEECH_THREAD_NAME,
    EngineUnavailable,
    SpeechConfig,
    SpeechEngine,
    SpeechStatistics,
    Transcript,
    TranscriptionRequest,
    Window,
)
from mlx_nursery.models import ModelLoadError, load_speech_model
from tests.speech_helpers import clip

GREEDY = (0.0,)


def test_transcript_equals_mlx_audio_generate_over_several_windows(tiny_whisper: Path) -> None:
    from mlx_nursery.engine import _whisper

    loaded = load_speech_model(tiny_whisper)
    audio = clip(31)  # two windows at least
    windows: list[Window] = []
    ours = _whisper.transcribe(
        loaded.model, TranscriptionRequest(audio, temperatures=GREEDY), lambda: None, windows.append
    )
    theirs = loaded.model.generate(audio, temperature=0.0, fp16=False, language="en")
    assert ours.windows >= 2
    assert ours.text == theirs.text
    # Theirs, with times kept inside the audio (the last window is padded to 30 s) and in
    # order (a start past the audio's end, an end before its start).
    duration = len(audio) / 16_000

    def within(start: float, end: float) -> tuple[float, float]:
        start = min(max(start, 0.0), duration)
        return start, min(max(end, start), duration)

    assert [(s.start, s.end, s.text, list(s.tokens)) for s in ours.segments] == [
        (*within(s["start"], s["end"]), s["text"], s["tokens"]) for s in theirs.segments
    ]
    assert all(0 <= s.start <= s.end <= duration for s in ours.segments)
    assert "".join(w.text for w in windows) == ours.text
    assert [s for w in windows for s in w.segments] == list(ours.segments)


def test_a_stop_ends_the_decode_at_the_next_token(tiny_whisper: Path) -> None:
    """`check` runs before every decoder step: the step after a stop never runs."""
    from mlx_nursery.engine import _whisper
    from mlx_nursery.engine._lane_worker import Stopped

    loaded = load_speech_model(tiny_whisper)
    calls = {"check": 0, "tokens": 0}

    def check() -> None:
        calls["check"] += 1
        if calls["check"] > 5:  # window check, then four decoder steps
            raise Stopped

    def on_token() -> None:
        calls["tokens"] += 1

    windows: list[Window] = []
    with pytest.raises(Stopped):
        _whisper.transcribe(
            loaded.model, TranscriptionRequest(clip(2)), check, windows.append, on_token
        )
    assert calls["tokens"] == 3  # the first check is the clip's, the second the window's
    assert windows == []


async def test_cancelled_between_windows_the_compute_stops_and_the_lane_returns(
    tiny_whisper: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        engine: SpeechEngine = await nursery.start(SpeechEngine(SpeechConfig(tiny_whisper)).run)
        assert [t.name for t in threading.enumerate()].count(SPEECH_THREAD_NAME) == 1
        async with engine.transcribe(TranscriptionRequest(clip(65), temperatures=GREEDY)) as rx:
            first = await rx.receive()
            assert isinstance(first, Window)
        stats = engine.statistics()
        assert stats.lanes_borrowed == 0 and not stats.running
        assert stats.cancelled == 1
        assert stats.windows_decoded <= 2  # of the three at least that 65 s need
        tokens = stats.tokens_decoded

        # The engine serves the next request whole.
        async with engine.transcribe(TranscriptionRequest(clip(2), temperatures=GREEDY)) as rx:
            events = [event async for event in rx]
        assert isinstance(events[-1], Transcript) and events[-1].windows == 1
        assert engine.statistics().tokens_decoded > tokens
        engine.close()
    assert SPEECH_THREAD_NAME not in [t.name for t in threading.enumerate()]


async def test_cancelled_while_queued_costs_no_compute(tiny_whisper: Path) -> None:
    """A transcription cancelled while it waits for the lane (another one holds it) never
    reaches the speech thread: the lane is the only way there. (Cancelled once submitted,
    it stops within a decoder step: the thread may have taken it already, so that case is
    not "no compute".)"""
    async with trio.open_nursery() as nursery:
        engine: SpeechEngine = await nursery.start(SpeechEngine(SpeechConfig(tiny_whisper)).run)
        scope = trio.CancelScope()
        entered: list[bool] = []

        async def queued() -> None:
            with scope:
                async with engine.transcribe(TranscriptionRequest(clip(2), temperatures=GREEDY)):
                    entered.append(True)

        async with engine.transcribe(TranscriptionRequest(clip(65), temperatures=GREEDY)):
            nursery.start_soon(queued)
            await trio.testing.wait_all_tasks_blocked()
            assert engine.statistics().queued == 1
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            stats = engine.statistics()
            assert stats.queued == 0 and stats.lanes_borrowed == 1  # only the running one
        assert entered == []
        assert engine.statistics().lanes_borrowed == 0
        engine.close()


async def test_close_refuses_a_transcription_waiting_for_the_lane_at_once(
    tiny_whisper: Path,
) -> None:
    """A transcription queued behind a running one when the engine closes (its model
    unloads) is refused at once, while the running one still holds the lane: it does not
    wait for that one to end."""
    refusals: list[int] = []  # lanes borrowed when the queued one was refused
    refused = trio.Event()
    async with trio.open_nursery() as nursery:
        engine: SpeechEngine = await nursery.start(SpeechEngine(SpeechConfig(tiny_whisper)).run)

        async def queued() -> None:
            try:
                async with engine.transcribe(TranscriptionRequest(clip(2), temperatures=GREEDY)):
                    pass
            except EngineUnavailable:
                refusals.append(engine.statistics().lanes_borrowed)
            refused.set()

        async with engine.transcribe(TranscriptionRequest(clip(65), temperatures=GREEDY)):
            nursery.start_soon(queued)
            await trio.testing.wait_all_tasks_blocked()
            assert engine.statistics().queued == 1
            engine.close()
            await refused.wait()
            assert refusals == [1]  # refused while the long one still runs
            assert engine.statistics().queued == 0
        # Leaving the block stopped the long one within a token; then the thread exited.
        assert engine.statistics().lanes_borrowed == 0
    assert engine.statistics().state == "closed"
    assert SPEECH_THREAD_NAME not in [t.name for t in threading.enumerate()]


async def test_the_threads_counters_reach_trio_only_in_its_posts(tiny_whisper: Path) -> None:
    """The speech thread writes nothing of the engine's state: its counters come with its
    posts. While the Trio thread is held (joining the speech thread, which runs its
    transcription to the end and exits), the statistics do not move; they move when Trio
    takes the posts, with the events they came with."""
    async with trio.open_nursery() as nursery:
        engine: SpeechEngine = await nursery.start(SpeechEngine(SpeechConfig(tiny_whisper)).run)
        [thread] = [t for t in threading.enumerate() if t.name == SPEECH_THREAD_NAME]
        async with engine.transcribe(TranscriptionRequest(clip(2), temperatures=GREEDY)) as rx:
            engine.close()  # the thread finishes this transcription, then exits
            thread.join()  # holds the Trio thread: none of the thread's posts is taken yet
            held = engine.statistics()
            events = [event async for event in rx]
    assert held == SpeechStatistics(
        state="stopping",
        lanes_borrowed=1,
        queued=0,
        running=False,
        windows_decoded=0,
        tokens_decoded=0,
        cancelled=0,
    )
    assert isinstance(events[-1], Transcript) and events[-1].windows == 1
    final = engine.statistics()
    assert final.state == "closed" and final.lanes_borrowed == 0 and not final.running
    assert final.windows_decoded == 1 and final.tokens_decoded > 0 and final.cancelled == 0


async def test_a_model_that_is_not_whisper_fails_to_load(tiny_model: Path) -> None:
    with pytest.raises(ExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(SpeechEngine(SpeechConfig(tiny_model)).run)
    assert raised.group_contains(ModelLoadError, match="not a Whisper")
    assert SPEECH_THREAD_NAME not in [t.name for t in threading.enumerate()]
