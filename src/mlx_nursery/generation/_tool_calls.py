"""Tool calls parsed out of model text, as it streams.

Parsing uses mlx-lm's tool parsers (picked by mlx-lm from the model's chat template and
exposed as `tokenizer.tool_parser`, with the markup `tool_call_start` / `tool_call_end`:
`_tools.ToolFormat`). What we add is the streaming state machine around them: text outside
calls streams as it comes, except a tail that might be the start of the markup, which is
held back until it resolves; a call is parsed when its end markup arrives; text after it
streams again; markup that turns out not to be a call is released as text.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from typing import Any

import attrs

from .. import fault_points
from ._tools import ToolFormat

log = logging.getLogger("mlx_nursery.openai")


@attrs.frozen
class ToolCallOut:
    index: int
    id: str
    name: str
    arguments: str
    """A JSON string, as OpenAI sends it (a prefix of one when the call was cut off)."""
    complete: bool = True
    """False for a call the token budget cut off: its arguments are what was generated."""


@attrs.frozen
class ContentText:
    text: str


Piece = ContentText | ToolCallOut


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ToolCallExtractor:
    """Feed model text; get content text and tool calls. The model's text is never lost:
    markup that does not make a call comes back as content, verbatim.

    A call is the text between the start and the end markup; it becomes a `ToolCallOut`
    only when the whole body parses into calls of tools the request declared (as vLLM's
    parsers read it). Otherwise (a body that does not parse, a call of an undeclared tool,
    nested start markup, a start markup left open at the end) the span, markup included,
    is content. In a JSON format a start markup whose next character cannot open a call
    (prose that mentions the tag) is content at once, so the text after it streams.
    Whitespace-only content around calls (the newline between two) is dropped: content
    stays empty when the model wrote nothing but calls."""

    def __init__(
        self,
        form: ToolFormat,
        tools: list[dict[str, Any]],
        *,
        max_calls: int | None = None,
    ) -> None:
        self._start, self._end = form.start, form.end
        self._parse = form.parse
        self._json = form.json
        self._tools = tools
        self._names = frozenset(t["function"]["name"] for t in tools)
        self._max_calls = max_calls
        self._buffer = ""
        self._in_call = False
        self._held = ""
        """Whitespace of a segment that has no other text yet: dropped if a call follows."""
        self._segment_text = False
        """The segment since the last call (or the start) has content other than whitespace."""
        self.calls = 0

    @property
    def done(self) -> bool:
        """No more calls are allowed (`max_calls` made: 1 with parallel_tool_calls false, or
        Responses' max_tool_calls): stop generating."""
        return self._max_calls is not None and self.calls >= self._max_calls

    def feed(self, text: str) -> list[Piece]:
        fault_points.reach("tool_call_parse")
        self._buffer += text
        pieces: list[Piece] = []
        while not self.done:
            if self._in_call:
                if not self._call_may_follow():
                    self._in_call = False  # prose that mentions the markup
                    self._content(self._start, pieces)
                    continue
                end = self._buffer.find(self._end) if self._end else -1
                if end < 0:  # no end markup (Mistral's has none): the call runs to the end
                    break
                body, self._buffer = self._buffer[:end], self._buffer[end + len(self._end) :]
                self._in_call = False
                self._span(body, self._start + body + self._end, pieces)
            else:
                start = self._buffer.find(self._start)
                if start < 0:
                    keep = len(self._buffer) - _partial_suffix(self._buffer, self._start)
                    ready, self._buffer = self._buffer[:keep], self._buffer[keep:]
                    self._content(ready, pieces)
                    break
                self._content(self._buffer[:start], pieces)
                self._buffer = self._buffer[start + len(self._start) :]
                self._in_call = True
        return pieces

    def finish(self, *, cut: bool = False) -> list[Piece]:
        """The generation ended: release held-back text. A call left without its end markup
        is a call if its body parses whole (as vLLM reads one); else, when the token budget
        ran out (`cut`), as OpenAI returns it: its name and the prefix of its arguments,
        marked incomplete; else content, as written. Cut by the budget, markup that can no
        longer make a call is dropped, not shown as the reply's text (an agent would keep it
        in its history): a call cut before its name, and start markup cut partway (more than
        its first character)."""
        if self.done:
            return []
        rest, self._buffer = self._buffer, ""
        pieces: list[Piece] = []
        if self._in_call:
            self._in_call = False
            body = rest  # less the end markup, if that was cut short ("...}}\n</")
            if self._end:
                body = rest[: len(rest) - _partial_suffix(rest, self._end)]
            calls = self._calls_from(body)
            if calls is None and cut:
                calls = self._partial_call(body)
            if calls is None and cut and _PARTIAL_NAME.search(body) is None:
                log.info("a tool call cut before its name by the token budget: dropped")
            elif calls is None:
                log.info("a tool call's start markup was left open: returned as content")
                self._content(self._start + rest, pieces)
            else:
                self._called(calls, pieces)
        else:
            partial = _partial_suffix(rest, self._start)
            if cut and partial > 1:
                rest = rest[: len(rest) - partial]
            self._content(rest, pieces)
        if self._held and not self.calls:  # a reply of whitespace only, no calls: as written
            pieces.append(ContentText(self._held))
        self._held = ""
        return pieces

    def _call_may_follow(self) -> bool:
        """False once a JSON format's body shows it cannot be a call: its first character is
        neither an opening brace or bracket nor the start of (nested) start markup."""
        if not self._json:
            return True
        head = self._buffer.lstrip()
        if not head:
            return True
        return head[0] in "{[" or self._start.startswith(head[: len(self._start)])

    def _span(self, body: str, written: str, pieces: list[Piece]) -> None:
        calls = self._calls_from(body)
        if calls is None:
            log.info("the model wrote tool-call markup that is not a call: returned as content")
            self._content(written, pieces)
        else:
            self._called(calls, pieces)

    def _called(self, calls: list[ToolCallOut], pieces: list[Piece]) -> None:
        """Calls made: the whitespace held before them is dropped, a new segment begins."""
        self._held, self._segment_text = "", False
        pieces.extend(calls)

    def _content(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        if not self._segment_text:
            if text.isspace():
                self._held += text
                return
            text, self._held, self._segment_text = self._held + text, "", True
        if pieces and isinstance(pieces[-1], ContentText):
            pieces[-1] = ContentText(pieces[-1].text + text)
        else:
            pieces.append(ContentText(text))

    def _partial_call(self, body: str) -> list[ToolCallOut] | None:
        """A cut-off call in the JSON format (`{"name": ..., "arguments": ...`): its name and
        what follows `"arguments":`. Other formats, no name yet or an undeclared one: None."""
        name = _PARTIAL_NAME.search(body)
        if name is None or not body.lstrip().startswith("{"):
            return None
        try:
            decoded_name = json.loads(f'"{name.group(1)}"')
        except json.JSONDecodeError:
            return None
        if decoded_name not in self._names:
            return None
        arguments = _PARTIAL_ARGUMENTS.search(body, name.end()) or _PARTIAL_ARGUMENTS.search(body)
        text = body[arguments.end() :].rstrip() if arguments is not None else ""
        try:  # arguments written whole, the wrapper after them cut: the arguments alone
            whole, end = json.JSONDecoder().raw_decode(text)
        except (json.JSONDecodeError, RecursionError):
            pass
        else:
            if isinstance(whole, dict):
                text = text[:end]
        call = ToolCallOut(self.calls, new_call_id(), decoded_name, text, complete=False)
        self.calls += 1
        return [call]

    def _calls_from(self, body: str) -> list[ToolCallOut] | None:
        """The calls in one call's markup, or None when it is not calls: a body that does not
        parse, parses to no call, or names a tool the request did not declare."""
        try:
            parsed = self._parse(body, self._tools)
        except _MALFORMED:  # the model's, not a server error
            return None
        found = parsed if isinstance(parsed, list) else [parsed]
        if not found or not all(
            isinstance(call, dict)
            and isinstance(call.get("name"), str)
            and call["name"] in self._names
            for call in found
        ):
            return None
        calls: list[ToolCallOut] = []
        for call in found:
            if self.done:
                break
            arguments = call.get("arguments", {})
            text = (
                arguments
                if isinstance(arguments, str)
                else json.dumps(arguments, ensure_ascii=False)
            )
            calls.append(ToolCallOut(self.calls, new_call_id(), call["name"], text))
            self.calls += 1
        return calls


_MALFORMED = (
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    SyntaxError,
    RecursionError,
)
"""What mlx-lm's tool parsers raise on a malformed call: json.loads and ast.literal_eval
(ValueError, SyntaxError, RecursionError when nested deep), their own ValueErrors, indexing
what was parsed (KeyError, IndexError, TypeError) and `.group` of a regex that found nothing
(AttributeError)."""
_PARTIAL_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_PARTIAL_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


def _partial_suffix(text: str, marker: str) -> int:
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0
