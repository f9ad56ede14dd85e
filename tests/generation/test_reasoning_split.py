"""The reasoning splitter and the thinking switch: pure logic, every way text can arrive."""

from __future__ import annotations

import pytest

from mlx_nursery.generation import InvalidRequest
from mlx_nursery.generation._reasoning import (
    AnswerPiece,
    ReasoningPiece,
    ReasoningSplitter,
    ThinkingFormat,
    thinking_on,
    thinking_switch,
)

QWEN3 = ThinkingFormat("<think>", "</think>", (7,), (8,), switchable=True)


def split(chunks: list[str], *, opened: bool = False) -> tuple[str, str, list[str]]:
    """(reasoning, answer, the kinds of pieces in order) of `chunks` fed one by one."""
    splitter = ReasoningSplitter(QWEN3, opened=opened)
    pieces = [p for chunk in chunks for p in splitter.feed(chunk)] + splitter.finish()
    reasoning = "".join(p.text for p in pieces if isinstance(p, ReasoningPiece))
    answer = "".join(p.text for p in pieces if isinstance(p, AnswerPiece))
    kinds = [type(p).__name__ for p in pieces]
    return reasoning, answer, kinds


def every_split(text: str) -> list[list[str]]:
    """`text` whole, one character at a time, and cut in two at every place."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


@pytest.mark.parametrize(
    "text, opened, reasoning, answer",
    [
        ("<think>\nI ponder.\n</think>\n\nHello <b>", False, "I ponder.", "Hello <b>"),
        ("\n<think>a < b\n\n c</think>x</think>", False, "a < b\n\n c", "x</think>"),
        ("I ponder.\n</think>\n\nHello", True, "I ponder.", "Hello"),
        ("Hello <think>x</think>", False, "", "Hello <think>x</think>"),  # only at the start
        ("\n\nHi", False, "", "\n\nHi"),  # no think block: the answer as it came
        ("<thin", False, "", "<thin"),  # a prefix that never became the marker
        ("<think>\ncut by the budget <", False, "cut by the budget <", ""),
        ("cut mid-thought </thi", True, "cut mid-thought </thi", ""),
        ("<think></think>", False, "", ""),
    ],
)
def test_the_split_is_the_same_however_the_text_arrives(
    text: str, opened: bool, reasoning: str, answer: str
) -> None:
    for chunks in every_split(text):
        got_reasoning, got_answer, kinds = split(chunks, opened=opened)
        assert (got_reasoning, got_answer) == (reasoning, answer), chunks
        # Reasoning first, then the answer: never back.
        assert kinds == sorted(kinds, key=lambda kind: kind != "ReasoningPiece"), chunks


def test_a_marker_split_across_tokens_never_leaks_and_nothing_waits_longer_than_it_must() -> None:
    splitter = ReasoningSplitter(QWEN3, opened=True)
    assert splitter.feed("step one") == [ReasoningPiece("step one")]
    assert splitter.feed(" </") == []  # could be the end marker: held
    assert splitter.feed("b>") == [ReasoningPiece(" </b>")]  # was not: released at once
    assert splitter.feed("\n</th") == []
    assert splitter.feed("ink>") == []  # the marker: gone, and the whitespace before it
    assert splitter.answering
    assert splitter.feed("\n\n") == []  # whitespace after the marker is dropped
    assert splitter.feed("Yes.") == [AnswerPiece("Yes.")]
    assert splitter.feed(" <think>") == [AnswerPiece(" <think>")]  # the answer passes as it is
    assert splitter.finish() == []


def test_the_prompt_says_whether_the_output_begins_mid_thought() -> None:
    assert QWEN3.opened_by([1, 2, 7, 5])  # the template opened the block
    assert not QWEN3.opened_by([1, 7, 5, 8, 5])  # ... and closed it (thinking off)
    assert not QWEN3.opened_by([1, 2, 3])
    two_tokens = ThinkingFormat("<a>", "</a>", (3, 4), (5, 6), switchable=False)
    assert two_tokens.opened_by([3, 4, 9]) and not two_tokens.opened_by([3, 4, 5, 6])


def test_effort_turns_a_switchable_templates_thinking_on_or_off() -> None:
    assert thinking_switch(QWEN3, "none", "reasoning_effort") is False
    assert all(thinking_switch(QWEN3, e, "reasoning_effort") for e in ("minimal", "low", "high"))
    assert thinking_switch(QWEN3, None, "reasoning_effort") is None
    fixed = ThinkingFormat("<think>", "</think>", (7,), (8,), switchable=False)
    assert thinking_switch(fixed, "none", "reasoning_effort") is None  # a hint then
    assert thinking_switch(None, "none", "reasoning_effort") is None
    assert (thinking_on(QWEN3, False), thinking_on(fixed, False), thinking_on(None, True)) == (
        False,
        None,
        None,
    )
    with pytest.raises(InvalidRequest) as refused:
        thinking_switch(QWEN3, "lots", "reasoning.effort")
    assert refused.value.param == "reasoning.effort"
