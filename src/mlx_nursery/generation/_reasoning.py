"""Reasoning models: the thinking told apart from the answer, and thinking turned on or off.

A model whose chat template thinks (Qwen3 and alike) writes `<think>...</think>` before its
answer. `ThinkingFormat` says how a model marks its thinking (mlx-lm infers the markers from
the vocabulary) and whether its template takes `enable_thinking`. `ReasoningSplitter` turns
the generated text into reasoning and answer pieces as it streams: it knows from the prompt
whether the template already opened the block (the output then begins mid-thought), holds
back a tail that could still become a marker (a `</think>` split across tokens never leaks
into the answer), and trims the whitespace around the markers. Only a block at the start of
the output is thinking: a marker later in the answer is text, as vLLM's and llama.cpp's
parsers read it, and as the grammar gate (`engine.ThinkingGate`) constrains it.

Nothing here is specific to an API: chat, Responses (and an Anthropic route: its `thinking`
blocks are the reasoning pieces, `thinking: {type: enabled | disabled}` the switch) use the
same splitter and switch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from .. import fault_points
from ._errors import InvalidRequest, quoted

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""OpenAI's `reasoning_effort` values (the spec's `ReasoningEffort`)."""


@attrs.frozen
class ThinkingFormat:
    """How a model marks its thinking, from mlx-lm's tokenizer wrapper."""

    start: str
    end: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    switchable: bool
    """The chat template reads `enable_thinking`: thinking can be turned off (or on)."""

    def opened_by(self, prompt: Sequence[int]) -> bool:
        """Whether the prompt leaves a think block open (its last start marker comes after
        its last end marker): the template opened it, and the output begins mid-thought."""
        start = _rfind(prompt, self.start_ids)
        return start >= 0 and start > _rfind(prompt, self.end_ids)


def thinking_format(tokenizer: Any) -> ThinkingFormat | None:
    """The model's thinking markers (None: the model does not think), as mlx-lm infers them."""
    if not getattr(tokenizer, "has_thinking", False):
        return None
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, dict) else [template]
    return ThinkingFormat(
        tokenizer.think_start,
        tokenizer.think_end,
        tuple(tokenizer.think_start_tokens),
        tuple(tokenizer.think_end_tokens),
        switchable=any(isinstance(t, str) and "enable_thinking" in t for t in texts),
    )


def _rfind(tokens: Sequence[int], marker: tuple[int, ...]) -> int:
    size = len(marker)
    for i in range(len(tokens) - size, -1, -1):
        if tuple(tokens[i : i + size]) == marker:
            return i
    return -1


def switchable(form: ThinkingFormat | None) -> bool:
    """Whether a request can turn this model's thinking on or off (its template reads
    `enable_thinking`); where it cannot, an effort is a hint the server does not act on."""
    return form is not None and form.switchable


def thinking_switch(form: ThinkingFormat | None, effort: str | None, param: str) -> bool | None:
    """The template's `enable_thinking` for a requested effort (`effort_switch`); None where
    the model's template has no switch, or the request set no effort."""
    if not switchable(form):
        return None
    return effort_switch(effort, param)


def thinking_on(form: ThinkingFormat | None, on: bool | None) -> bool | None:
    """The template's `enable_thinking` for an API that asks for thinking on or off directly
    (Anthropic's `thinking: {type: enabled | disabled}`); None where the template has no
    switch (the request's wish is then a hint the server does not act on)."""
    return on if switchable(form) else None


def effort_switch(effort: str | None, param: str) -> bool | None:
    """OpenAI's effort as a template's switch: "none" turns thinking off, any other level on
    (a template has no levels); None leaves the template's default. 400 for a value that is
    not an effort."""
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise InvalidRequest(
            f"{param} must be one of {', '.join(EFFORTS)}, got {quoted(effort)}",
            param=param,
            code="invalid_value",
        )
    return effort != "none"


# -- the splitter -------------------------------------------------------------------------------
@attrs.frozen
class ReasoningPiece:
    text: str


@attrs.frozen
class AnswerPiece:
    text: str


Piece = ReasoningPiece | AnswerPiece
_State = Literal["start", "thinking", "after", "answer"]


class ReasoningSplitter:
    """Feed generated text; get reasoning and answer pieces, the markers never included.

    States: "start" (the output may open a think block: leading whitespace and a prefix of
    the start marker are held), "thinking" (a tail that could begin the end marker, and
    trailing whitespace, are held), "after" (whitespace after the end marker is dropped),
    "answer" (text passes as it comes). One per sequence."""

    def __init__(self, format: ThinkingFormat, *, opened: bool) -> None:
        self._start, self._end = format.start, format.end
        self._state: _State = "thinking" if opened else "start"
        self._buffer = ""
        self._began = False
        """Reasoning text was given out (leading whitespace is dropped until then)."""

    @property
    def thinking(self) -> bool:
        """Inside the think block (or perhaps about to open it, at the start)."""
        return self._state == "thinking"

    @property
    def answering(self) -> bool:
        """The thinking is over (or never was): what follows is the answer."""
        return self._state in ("after", "answer")

    def feed(self, text: str) -> list[Piece]:
        fault_points.reach("reasoning_split")
        if self._state == "answer":
            return [AnswerPiece(text)] if text else []
        self._buffer += text
        pieces: list[Piece] = []
        if self._state == "start":
            self._open(pieces)
        if self._state == "thinking":
            self._think(pieces)
        if self._state == "after":
            self._after(pieces)
        return pieces

    def finish(self) -> list[Piece]:
        """The output ended: what was held back. Thinking cut short stays reasoning (without
        its trailing whitespace); a start that never became a marker is the answer's."""
        rest, self._buffer = self._buffer, ""
        if self._state == "thinking":
            rest = rest.rstrip() if self._began else rest.strip()
            return [ReasoningPiece(rest)] if rest else []
        if self._state == "start":
            return [AnswerPiece(rest)] if rest else []
        return []

    def _open(self, pieces: list[Piece]) -> None:
        head = self._buffer.lstrip()
        if head.startswith(self._start):
            self._buffer = head[len(self._start) :]
            self._state = "thinking"
        elif not self._start.startswith(head):  # "" (only whitespace so far) is a prefix
            self._state = "answer"
            pieces.append(AnswerPiece(self._buffer))
            self._buffer = ""

    def _think(self, pieces: list[Piece]) -> None:
        if not self._began:
            self._buffer = self._buffer.lstrip()
        end = self._buffer.find(self._end)
        if end >= 0:
            thought = self._buffer[:end].rstrip()
            self._buffer = self._buffer[end + len(self._end) :]
            self._state = "after"
        else:
            keep = _partial_suffix(self._buffer, self._end)
            ready = self._buffer[: len(self._buffer) - keep]
            thought = ready.rstrip()
            self._buffer = self._buffer[len(thought) :]
        if thought:
            self._began = True
            pieces.append(ReasoningPiece(thought))

    def _after(self, pieces: list[Piece]) -> None:
        answer = self._buffer.lstrip()
        self._buffer = ""
        if answer:
            self._state = "answer"
            pieces.append(AnswerPiece(answer))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0
