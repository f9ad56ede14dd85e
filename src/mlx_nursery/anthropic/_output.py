"""What the Messages API sends: the message object, its stream of named events, and
errors in Anthropic's envelope with Anthropic's statuses.

The stream (Anthropic's order): `message_start` (the message, empty, with the prompt's
tokens: sent once the engine has admitted the request, so that its split between tokens
prefilled and read from the prefix cache is the one `message_delta` repeats), a `ping`,
then each content block as `content_block_start`, its deltas (`text_delta`; one
`input_json_delta` holding a call's whole input, which this server parses before it sends
a call), `content_block_stop`; then `message_delta` (stop_reason, stop_sequence, the final
usage) and `message_stop`. A failure after the stream began ends it with an `error` event.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import attrs

from ..engine import Usage
from ..generation import (
    Admitted,
    Finished,
    OpenAIError,
    Overloaded,
    Prepared,
    ReasoningDelta,
    TextDelta,
    ToolCallOut,
)

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
OVERLOADED = 529
"""Anthropic's status for "overloaded, retry later" (the queue is full), where chat answers
503. A server that is loading or shutting down stays 503."""


def stop_reason(finished: Finished) -> StopReason:
    if finished.reason == "tool_calls":
        return "tool_use"
    if finished.reason == "length":
        return "max_tokens"
    return "stop_sequence" if finished.stop_sequence is not None else "end_turn"


def usage_json(usage: Usage) -> dict[str, int]:
    """Anthropic counts a cached prefix apart: input_tokens are those prefilled, the prefix
    cache's tokens are cache reads; this server writes no cache entries on request."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }


def tool_use_block(call: ToolCallOut, input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": input}


def tool_use_id(call: ToolCallOut) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def arguments_input(arguments: str) -> Any:
    """A call's arguments as an input object; a call cut off by max_tokens (not JSON yet) is
    `{}`, its stop_reason says why."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def thinking_block(thinking: str) -> dict[str, Any]:
    """A thinking model's reasoning as Anthropic's `thinking` block. Its `signature` (which
    Anthropic's API uses to check thinking sent back) is empty: this server signs nothing,
    and takes thinking blocks back as they are."""
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def message_body(
    p: Prepared, content: Sequence[dict[str, Any]], finished: Finished
) -> dict[str, Any]:
    """The message of a non-streaming request, its content blocks as `MessageContent`
    gathered them."""
    return {
        **_message_head(p),
        "content": list(content),
        "stop_reason": stop_reason(finished),
        "stop_sequence": finished.stop_sequence,
        "usage": usage_json(finished.usage),
    }


@attrs.define
class MessageContent:
    """A non-streaming message's content blocks, folded from the events its stream would
    send (`MessageEvents`), as the SDKs' stream accumulators fold them: the blocks come in
    the order the model wrote them (text after a call stays after it) and split where the
    stream splits them, so a message reads the same streamed or not."""

    events: MessageEvents
    _blocks: list[dict[str, Any]] = attrs.Factory(list)
    _pieces: list[list[str]] = attrs.Factory(list)
    """Each block's text or thinking pieces, joined once at the end (a string grown piece by
    piece would be copied whole at each)."""

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """The blocks so far, their text joined."""
        blocks = []
        for block, pieces in zip(self._blocks, self._pieces, strict=True):
            kind = block["type"]  # a text or thinking block's text is its type's field
            blocks.append(
                {**block, kind: "".join(pieces)} if kind in ("text", "thinking") else block
            )
        return blocks

    def thinking(self, delta: ReasoningDelta) -> None:
        self._fold(self.events.thinking(delta))

    def text(self, delta: TextDelta) -> None:
        self._fold(self.events.text(delta))

    def call(self, call: ToolCallOut) -> None:
        self._fold(self.events.call(call))

    def _fold(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if event["type"] == "content_block_start":
                self._blocks.append(dict(event["content_block"]))
                self._pieces.append([])
            elif event["type"] == "content_block_delta":
                index, delta = event["index"], event["delta"]
                if delta["type"] == "text_delta":
                    self._pieces[index].append(delta["text"])
                elif delta["type"] == "thinking_delta":
                    self._pieces[index].append(delta["thinking"])
                elif delta["type"] == "input_json_delta":
                    self._blocks[index]["input"] = arguments_input(delta["partial_json"])


def _message_head(p: Prepared) -> dict[str, Any]:
    return {"id": p.id, "type": "message", "role": "assistant", "model": p.model}


@attrs.define
class MessageEvents:
    """The events of one message's stream, block by block (one instance per stream)."""

    prepared: Prepared
    index: int = -1
    """The content block open or last closed (-1: none yet)."""
    open: str | None = None
    """The type of the content block open ("thinking", "text"; None: none is)."""

    def opening(self, admitted: Admitted) -> list[dict[str, Any]]:
        """`message_start` and a `ping`, once the request is admitted: the prompt's usage
        then is its final one (the same input and cache read tokens), nothing generated."""
        message = {
            **_message_head(self.prepared),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_json(attrs.evolve(admitted.usage, completion_tokens=0)),
        }
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def thinking(self, delta: ReasoningDelta) -> list[dict[str, Any]]:
        """A piece of a thinking model's reasoning: a `thinking_delta` in a thinking block."""
        if not delta.text:
            return []
        events = [] if self.open == "thinking" else self._start(thinking_block(""))
        delta_event = {"type": "thinking_delta", "thinking": delta.text}
        events.append({"type": "content_block_delta", "index": self.index, "delta": delta_event})
        return events

    def text(self, delta: TextDelta) -> list[dict[str, Any]]:
        if not delta.text:
            return []
        events = [] if self.open == "text" else self._start({"type": "text", "text": ""})
        delta_event = {"type": "text_delta", "text": delta.text}
        events.append({"type": "content_block_delta", "index": self.index, "delta": delta_event})
        return events

    def call(self, call: ToolCallOut) -> list[dict[str, Any]]:
        events = self._start(tool_use_block(call, {}))
        partial = {"type": "input_json_delta", "partial_json": call.arguments}
        events.append({"type": "content_block_delta", "index": self.index, "delta": partial})
        return events + self._stop()

    def finish(self, finished: Finished) -> list[dict[str, Any]]:
        delta = {"stop_reason": stop_reason(finished), "stop_sequence": finished.stop_sequence}
        return [
            *self._stop(),
            {"type": "message_delta", "delta": delta, "usage": usage_json(finished.usage)},
            {"type": "message_stop"},
        ]

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._stop()
        self.index += 1
        self.open = block["type"]
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*events, start]

    def _stop(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        events: list[dict[str, Any]] = []
        if self.open == "thinking":  # Anthropic closes a thinking block with its signature
            signature = {"type": "signature_delta", "signature": ""}
            events.append({"type": "content_block_delta", "index": self.index, "delta": signature})
        self.open = None
        return [*events, {"type": "content_block_stop", "index": self.index}]


def error_status(error: OpenAIError) -> int:
    return OVERLOADED if isinstance(error, Overloaded) else error.status


def error_body(error: OpenAIError, request_id: str | None = None) -> dict[str, Any]:
    """Anthropic's envelope, `{"type": "error", "error": {"type", "message"}}`: the type
    from the status (Anthropic's table; 503 a server not serving is "api_error")."""
    status = error_status(error)
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": error.message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body
