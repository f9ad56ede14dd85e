"""Pure logic of how streams batch their writes (the HTTP tests check it on the wire)."""

from __future__ import annotations

from mlx_nursery.engine import Usage
from mlx_nursery.generation import Finished, TextDelta
from mlx_nursery.generation._logprobs import LogprobEntry
from mlx_nursery.serving._batching import WritePolicy, merged_text


def test_adaptive_interval_grows_by_one_per_eight_open_streams() -> None:
    policy = WritePolicy()
    intervals = {}
    for n in (0, 1, 8, 9, 16, 17, 32, 33):
        policy.open_streams = n
        intervals[n] = policy.interval()
    assert intervals == {0: 1, 1: 1, 8: 1, 9: 2, 16: 2, 17: 3, 32: 4, 33: 5}


def test_a_fixed_interval_ignores_the_load_and_streams_are_uncounted_on_exit() -> None:
    policy = WritePolicy(4)
    try:
        with policy.stream():
            assert policy.interval() == 4 and policy.open_streams == 1
            raise RuntimeError("the client went away")
    except RuntimeError:
        pass
    assert policy.open_streams == 0
    assert policy.interval() == 4


def test_runs_of_text_merge_and_nothing_else_does() -> None:
    a = LogprobEntry("a", -0.1, ())
    b = LogprobEntry("b", -0.2, ())
    done = Finished("stop", Usage(1, 2, 0))
    items = [TextDelta("a", (a,)), TextDelta("b", (b,)), done]
    assert merged_text(items) == [TextDelta("ab", (a, b)), done]
    assert merged_text([done, TextDelta("x")]) == [done, TextDelta("x")]
