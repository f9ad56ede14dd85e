"""The scripted model's parts: its stepper on a fake clock (when each piece comes, how long a
step may sleep), a script built from the wire, and the engine running it end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from mlx_nursery.engine import EngineConfig, GenerationRequest, Script, open_engine
from mlx_nursery.engine._messages import Submit
from mlx_nursery.engine._scripted import SLICE_SECONDS, ScriptedStepper
from mlx_nursery.engine._sequence import build_sequence
from mlx_nursery.engine._stepper import Start
from mlx_nursery.testing._scripts import parse_script, script_for

EOS = 2


class FakeClock:
    """Time that moves only when the stepper sleeps: the steps' order, without waiting."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _run(script: Script, max_tokens: int = 100) -> tuple[list[tuple[float, list[Any]]], Any]:
    """Step one sequence to its end: (the time each step returned at, its tokens and finish
    reasons) for each step that returned something; and the sequence."""
    clock = FakeClock()
    stepper = ScriptedStepper(16, EOS, clock=clock, sleep=clock.sleep)
    request = GenerationRequest([1, 2, 3], max_tokens, script=script)
    sequence = build_sequence(Submit(0, request), frozenset({EOS}))
    stepper.insert(sequence, Start([1, 2, 3], None, [], max_tokens))
    start, steps = clock.now, []
    for _ in range(10_000):
        if not stepper.uids or sequence.failures:
            break
        responses = stepper.step()
        if responses:
            steps.append(
                (round(clock.now - start, 6), [(r.token, r.finish_reason) for r in responses])
            )
    assert all(s <= SLICE_SECONDS for s in clock.sleeps), "a step slept past its slice"
    return steps, sequence


def test_each_piece_comes_when_its_delay_says_and_the_end_rides_with_the_last() -> None:
    steps, sequence = _run(Script([[5], [6, 7], [8]], [0.1, 0.05, 0.2, 0.0]))
    assert steps == [
        (0.1, [(5, None)]),
        (0.15, [(6, None), (7, None)]),  # a chunk's tokens come together
        (0.35, [(8, None), (EOS, "stop")]),
    ]
    assert sequence.failures == []


def test_max_tokens_cuts_the_script_with_length_and_a_stop_token_ends_it() -> None:
    steps, _ = _run(Script([[5], [6, 7], [8]], [0, 0, 0, 0]), max_tokens=2)
    assert [token for _, tokens in steps for token in tokens] == [(5, None), (6, "length")]
    steps, _ = _run(Script([[5], [EOS], [8]], [0, 0, 0, 0]))
    assert [token for _, tokens in steps for token in tokens] == [(5, None), (EOS, "stop")]


@pytest.mark.parametrize("after", [0, 2, 5])
def test_error_after_fails_the_sequence_after_that_many_pieces(after: int) -> None:
    steps, sequence = _run(Script([[5], [6], [7]], [0.1, 0.1, 0.1, 0.0], error_after=after))
    emitted = [token for _, tokens in steps for token, _ in tokens]
    assert emitted == [5, 6, 7][: min(after, 3)]  # never its EOS: it fails instead
    assert len(sequence.failures) == 1


def test_an_empty_script_ends_after_its_first_token_delay() -> None:
    steps, _ = _run(Script([], [0.3]))
    assert steps == [(0.3, [(EOS, "stop")])]


def test_a_script_from_the_wire_tokenizes_its_output_and_draws_its_delays() -> None:
    class Words:
        """A tokenizer of one token per character, enough to count pieces."""

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

    spec = parse_script(
        {
            "output": {"chunks": ["ab", "c", "de"]},
            "ttft": 1.5,
            "token_delay": {"min": 0.1, "max": 0.2, "seed": 7},
            "stalls": [{"at": 2, "seconds": 3}, {"at": 9, "seconds": 1}],
            "fault": {"error_after": 1},
        }
    )
    script = script_for(spec, None, Words(), echo=lambda: "")
    assert script.pieces == ((97, 98), (99,), (100, 101))
    assert script.delays[0] == 1.5 and script.delays[-1] == 0.0
    assert 0.1 <= script.delays[1] <= 0.2 and 3.1 <= script.delays[2] <= 3.2
    assert script == script_for(spec, None, Words(), echo=lambda: ""), "the seed fixes the draws"
    assert script.error_after == 1


async def test_the_engine_serves_the_scripted_model_without_compute() -> None:
    config = EngineConfig("scripted", max_concurrency=2)
    async with open_engine(config) as engine:
        assert engine.model.scripted
        encode = engine.model.tokenizer.encode
        pieces = [[t] for t in encode("Hello there")]
        script = Script(pieces, [0.0] * (len(pieces) + 1))
        texts: list[str] = []

        async def one() -> None:
            async with engine.generate(GenerationRequest([1], 50, script=script)) as stream:
                texts.append("".join([event.text async for event in stream]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
        assert texts == ["Hello there", "Hello there"]
        stats = engine.statistics()
        assert stats.lanes_borrowed == 0 and stats.worker is not None
        assert stats.worker.prompt_tokens_processed == 0 and stats.worker.solo_steps == 0


def test_a_bad_script_file_stops_the_start(tmp_path: Path) -> None:
    from mlx_nursery.settings import Settings, SettingsError
    from mlx_nursery.testing._harness import default_script

    path = tmp_path / "script.json"
    path.write_text('{"output": {"text": "ok"}, "ttft": -1}')
    with pytest.raises(SettingsError, match=r"script\.ttft"):
        default_script(Settings(script=str(path)))
    path.write_text("{not json")
    with pytest.raises(SettingsError, match=r"script\.json"):
        default_script(Settings(script=str(path)))
    path.write_text('{"output": {"text": "ok"}}')
    spec = default_script(Settings(script=str(path)))
    assert spec is not None and spec.output == {"text": "ok"}
