"""The batch's prefill schedule (`engine/_schedule.py`): which call of the generator gives
each sequence its first token, and that the schedule changes when tokens come, never which.

Driven directly on the tiny model: the schedule is a property of the generator's calls,
which the engine makes one per loop iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.utils import load

from mlx_nursery.engine._chunking import ChunkSizer
from mlx_nursery.engine._schedule import ServingBatchGenerator


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Any:
    return load(str(tiny_model))[0]


@pytest.fixture(params=[False, True], ids=["chunks-apart", "chunks-packed"])
def packing(request: pytest.FixtureRequest) -> bool:
    """Every schedule holds whether a chunk beside decoding rows runs in their step's forward
    (`_packed.py`) or apart."""
    return bool(request.param)


def _prompts(count: int, length: int) -> list[list[int]]:
    return [[(7 * i + 3 * j) % 500 + 1 for j in range(length)] for i in range(count)]


def _first_token_calls(
    generator: BatchGenerator, prompts: list[list[int]], max_tokens: int = 4
) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Insert `prompts` at once; return, per uid, the call (1-based) that gave its first token,
    and all its tokens."""
    uids = generator.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    first: dict[int, int] = {}
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    calls = 0
    while any(len(t) < max_tokens for t in tokens.values()):
        calls += 1
        assert calls < 100, "the generator stopped making progress"
        for response in generator.next()[1]:
            first.setdefault(response.uid, calls)
            tokens[response.uid].append(response.token)
    generator.close()
    return {uids.index(uid): call for uid, call in first.items()}, {
        uids.index(uid): t for uid, t in tokens.items()
    }


def test_a_prompt_batch_turns_over_every_call_and_its_first_token_follows_its_last_chunk(
    model: Any,
    packing: bool,
) -> None:
    """Three groups of two prompts that each fit one chunk: group k is prefilled in call k
    and gives its first token in call k + 1. mlx-lm's own order (admission before the last
    group leaves, the move a call after the last chunk) gives 2, 4, 6."""
    generator = ServingBatchGenerator(
        model,
        pack_chunks=packing,
        completion_batch_size=8,
        prefill_batch_size=2,
        prefill_step_size=64,
    )
    first, _ = _first_token_calls(generator, _prompts(6, 20))
    assert [first[i] for i in range(6)] == [2, 2, 3, 3, 4, 4]

    upstream = BatchGenerator(
        model, completion_batch_size=8, prefill_batch_size=2, prefill_step_size=64
    )
    upstream_first, _ = _first_token_calls(upstream, _prompts(6, 20))
    assert [upstream_first[i] for i in range(6)] != [2, 2, 3, 3, 4, 4]  # the change is real


def test_a_long_prompt_takes_one_call_per_chunk_then_one_for_its_first_token(
    model: Any,
    packing: bool,
) -> None:
    generator = ServingBatchGenerator(
        model,
        pack_chunks=packing,
        completion_batch_size=4,
        prefill_batch_size=4,
        prefill_step_size=16,
    )
    # 50 tokens: 49 prefilled in chunks of 16, 16, 16, 1, then the last token decodes.
    first, _ = _first_token_calls(generator, _prompts(1, 50))
    assert first == {0: 5}


def test_a_one_token_prompt_starts_decoding_without_a_prefill_chunk(
    model: Any, packing: bool
) -> None:
    generator = ServingBatchGenerator(
        model,
        pack_chunks=packing,
        completion_batch_size=4,
        prefill_batch_size=4,
        prefill_step_size=16,
    )
    first, tokens = _first_token_calls(generator, [[5], *_prompts(1, 10)])
    assert first == {0: 2, 1: 2}
    # the second prompt's ten, its last in its chunk (`_first_tokens`); none of the first's
    assert generator.prefilled_tokens == 10
    assert all(len(t) == 4 for t in tokens.values())


@pytest.mark.parametrize(("count", "length", "step"), [(6, 20, 64), (5, 37, 8), (9, 3, 2)])
def test_the_schedule_changes_when_tokens_come_never_which(
    model: Any, packing: bool, count: int, length: int, step: int
) -> None:
    """Greedy tokens of every sequence equal mlx-lm's own generator's, prompts of mixed
    lengths included (right-padded in one prefill batch)."""
    prompts = [p[: length - i % 3] for i, p in enumerate(_prompts(count, length))]

    def run(cls: Callable[..., BatchGenerator]) -> dict[int, list[int]]:
        generator = cls(
            model, completion_batch_size=4, prefill_batch_size=3, prefill_step_size=step
        )
        return _first_token_calls(generator, prompts, max_tokens=6)[1]

    assert run(partial(ServingBatchGenerator, pack_chunks=packing)) == run(BatchGenerator)


class _RecordingSizer(ChunkSizer):
    """A real sizer that also keeps each observation it is given."""

    def __init__(self, largest: int) -> None:
        super().__init__(largest, budget_ms=None)
        self.observed: list[tuple[int, float]] = []

    def observe(self, tokens: int, seconds: float) -> None:
        self.observed.append((tokens, seconds))
        super().observe(tokens, seconds)


def test_a_chunk_beside_decoding_is_launched_not_waited_for_and_timed_once_landed(
    model: Any,
    packing: bool,
) -> None:
    """A prompt prefilled while nothing decodes is timed at once (evaluated in its call); one
    prefilled beside a decoding sequence is not evaluated in its call: its cost reaches the
    sizer two decode steps later, from the gaps it widened, while the decoding sequence
    gets a token in every call. The tokens are mlx-lm's own generator's."""
    sizer = _RecordingSizer(16)
    generator = ServingBatchGenerator(
        model,
        pack_chunks=packing,
        completion_batch_size=4,
        prefill_batch_size=4,
        prefill_step_size=16,
        chunk_sizer=sizer,
    )
    prompts = _prompts(2, 40)
    (first,) = generator.insert([prompts[0][:10]], max_tokens=[12])
    generator.next()  # its 10-token chunk (its last token too), nothing decoding beside it
    assert [tokens for tokens, _ in sizer.observed] == [10]
    tokens: dict[int, list[int]] = {first: []}
    for response in generator.next()[1]:  # its first token
        tokens[response.uid].append(response.token)
    (second,) = generator.insert([prompts[1]], max_tokens=[4])
    tokens[second] = []
    observed_per_call = []
    for _ in range(3):  # chunks of 16, 16, 8 launched beside the first sequence's decode
        responses = generator.next()[1]
        assert [r.uid for r in responses] == [first]
        tokens[first].append(responses[0].token)
        observed_per_call.append([t for t, _ in sizer.observed[1:]])
    assert observed_per_call == [[], [], [16]]  # the first chunk, two decode steps on
    while len(tokens[second]) < 4:
        for response in generator.next()[1]:
            tokens[response.uid].append(response.token)
    generator.close()

    upstream = BatchGenerator(
        model, completion_batch_size=4, prefill_batch_size=4, prefill_step_size=16
    )
    expected: dict[int, list[int]] = {}
    uids = upstream.insert([prompts[0][:10], prompts[1]], max_tokens=[12, 4])
    while any(len(expected.get(uid, [])) < n for uid, n in zip(uids, (12, 4), strict=True)):
        for response in upstream.next()[1]:
            expected.setdefault(response.uid, []).append(response.token)
    upstream.close()
    assert tokens[second] == expected[uids[1]]
    assert tokens[first] == expected[uids[0]][: len(tokens[first])]
