"""StopMatcher: pure logic, fed piece by piece as tokens arrive."""

from __future__ import annotations

import pytest

from mlx_nursery.generation._stop import StopMatcher


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = "".join(matcher.feed(p) for p in pieces)
    return out + matcher.flush(), matcher.stopped


@pytest.mark.parametrize(
    ("stops", "pieces", "expected"),
    [
        (("END",), ["abc E", "N", "D tail"], ("abc ", True)),
        (("END",), ["abc E", "N", "x"], ("abc ENx", False)),
        (("END",), ["abc EN"], ("abc EN", False)),  # released at the end, no match
        (("\n\n", "##"), ["a\n", "b#", "#c"], ("a\nb", True)),
        (("ab", "b"), ["xab"], ("x", True)),  # earliest match wins
        ((), ["a", "b"], ("ab", False)),
        (("é!",), ["caf", "é", "!"], ("caf", True)),
    ],
)
def test_stop_matching(
    stops: tuple[str, ...], pieces: list[str], expected: tuple[str, bool]
) -> None:
    assert run(stops, pieces) == expected


def test_no_partial_stop_string_is_ever_emitted() -> None:
    matcher = StopMatcher(("STOP",))
    emitted = [matcher.feed(p) for p in ["x S", "T", "O"]]
    assert emitted == ["x ", "", ""]
    assert matcher.feed("P and more") == "" and matcher.stopped
    assert matcher.feed("ignored") == ""
