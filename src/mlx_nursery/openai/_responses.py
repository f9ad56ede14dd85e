"""The Responses API: input items to a chat conversation, generation outputs to response
objects and the stream's events.

A response's conversation (chat messages, instructions excluded) is what a follow-up with
`previous_response_id` replays; `instructions` apply to one response only.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import attrs

from ..engine import Usage
from . import _params as params
from ._converter import structure
from ._endpoints import (
    Prepared,
    _common,
    _offered_tools,
    _prepare,
    with_logprobs,
    with_processors,
    with_response_format,
    with_tools,
)
from ._errors import InvalidRequest, OpenAIError, quoted, shortened
from ._generation import Finished
from ._logprobs import LogprobEntry
from ._prompts import check_prompt_size, prompt_texts, render_chat
from ._schemas import ChatMessage, SamplingFields
from ._served import ServedModel
from ._tools import ToolCallOut, strict_tool_names

MAX_CONVERSATION_MESSAGES = 1000


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@attrs.define(kw_only=True)
class ResponsesRequest:
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: str | None = None
    include: list[str] | None = None
    background: bool | None = None
    top_logprobs: int | None = None
    service_tier: str | None = None
    max_tool_calls: int | None = None
    prompt: Any = None
    conversation: Any = None
    prompt_cache_retention: str | None = None


LOGPROBS_INCLUDE = "message.output_text.logprobs"
REASONING_INCLUDE = "reasoning.encrypted_content"
"""Satisfied as asked: no model served here emits reasoning items, so there is none to
include (Codex-style clients send it with store: false)."""
_INCLUDABLE = (LOGPROBS_INCLUDE, REASONING_INCLUDE)
_UNIMPLEMENTED: dict[str, object] = {
    "background": False,
    "service_tier": ("auto", "default"),
    "prompt": (),
    "conversation": (),
    "truncation": ("disabled", "auto"),
}
_HINTS: dict[str, object] = {
    # field: its no-op value(s); anything else is accepted, ignored and named (or a 400, strict)
    "prompt_cache_retention": (),  # the prefix cache keeps what its budget allows
    "reasoning": ({}, {"effort": None}, {"summary": None}, {"effort": None, "summary": None}),
}


def parse_request(body: Any) -> ResponsesRequest:
    request = structure(body, ResponsesRequest)
    params.reject_unimplemented(request, _UNIMPLEMENTED)
    for i, included in enumerate(request.include or []):
        if included not in _INCLUDABLE:
            raise InvalidRequest(
                f"include {quoted(included)} is not supported by this server",
                param=f"include[{i}]",
                code="unsupported_parameter",
            )
    if request.max_tool_calls is not None:
        params.require(
            request.max_tool_calls >= 1, "max_tool_calls", "max_tool_calls must be at least 1"
        )
    if request.stream_options is not None:
        params.require(
            bool(request.stream),
            "stream_options",
            "stream_options is only allowed when stream is true",
        )
        for key in request.stream_options:
            if key != "include_obfuscation":
                raise InvalidRequest(
                    f"Unrecognized request argument supplied: stream_options.{shortened(key)}",
                    param=f"stream_options.{shortened(key)}",
                    code="unknown_parameter",
                )
    if request.top_logprobs is not None:
        params.require(
            0 <= request.top_logprobs <= 20, "top_logprobs", "top_logprobs must be between 0 and 20"
        )
        params.require(
            LOGPROBS_INCLUDE in (request.include or []),
            "top_logprobs",
            f"top_logprobs needs include: ['{LOGPROBS_INCLUDE}']",
        )
    if request.metadata is not None and len(request.metadata) > 16:
        raise InvalidRequest(
            "metadata takes at most 16 keys", param="metadata", code="invalid_value"
        )
    _check_text(request.text)
    return request


_FORMAT_FIELDS: dict[str, tuple[type, ...]] = {
    "type": (str,),
    "name": (str,),
    "description": (str,),
    "schema": (dict,),
    "strict": (bool,),
}


def _check_text(text: dict[str, Any] | None) -> None:
    """`text` is echoed in the response: only its fields, of their types. (The format's
    meaning is checked where it becomes a grammar, `_structured`.)"""
    for key in text or {}:
        if key not in ("format", "verbosity"):
            raise InvalidRequest(
                f"Unrecognized request argument supplied: text.{shortened(key)}",
                param=f"text.{shortened(key)}",
                code="unknown_parameter",
            )
    form = (text or {}).get("format")
    if not isinstance(form, dict):
        return  # None is the default; anything else is refused by `_structured`
    for key, value in form.items():
        kinds = _FORMAT_FIELDS.get(key)
        if kinds is None:
            raise InvalidRequest(
                f"Unrecognized request argument supplied: text.format.{shortened(key)}",
                param=f"text.format.{shortened(key)}",
                code="unknown_parameter",
            )
        if value is not None and not isinstance(value, kinds):
            raise InvalidRequest(
                f"'text.format.{key}' must be {_KIND_NAMES[kinds[0]]}",
                param=f"text.format.{key}",
                code="invalid_value",
            )


_KIND_NAMES = {str: "a string", dict: "an object", bool: "a boolean"}


@attrs.frozen
class PreparedResponse:
    request: ResponsesRequest
    prepared: Prepared
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    """Previous conversation plus this turn's input, as chat messages (stored whole, even
    when `truncation: "auto"` left its oldest messages out of this prompt)."""
    truncated_messages: int = 0
    """Messages `truncation: "auto"` left out of the prompt (the x-truncated-messages header)."""
    id: str = attrs.field(factory=lambda: item_id("resp"))
    created_at: int = attrs.field(factory=lambda: int(time.time()))

    @property
    def store(self) -> bool:
        return self.request.store is not False


def prepare_response(
    request: ResponsesRequest, served: ServedModel, previous: list[dict[str, Any]] | None
) -> PreparedResponse:
    served.check(request.model)
    ignored = _ignored_hints(request, served)
    items = _input_items(request.input)
    conversation = [*(previous or []), *_to_messages(items)]
    if len(conversation) > MAX_CONVERSATION_MESSAGES:
        raise InvalidRequest(
            f"the conversation exceeds {MAX_CONVERSATION_MESSAGES} messages",
            param="previous_response_id",
            code="conversation_too_long",
        )
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    messages = [structure(m, ChatMessage) for m in system + conversation]
    fields = SamplingFields(
        model=request.model,
        stream=request.stream,
        temperature=request.temperature,
        top_p=request.top_p,
        user=request.user,
    )
    common = _common(fields, served)
    tools, forced = _offered_tools(_ToolView(request), served)
    dropped = 0
    if request.truncation == "auto":
        messages, dropped = _truncated(
            served, messages, len(system), tools, request.max_output_tokens
        )
    check_prompt_size(served, prompt_texts(messages, tools), "input")
    tokens = render_chat(served.tokenizer, messages, tools, native_tools=served.tool_format.native)
    prepared = _prepare(
        "chat",
        fields,
        served,
        tokens,
        request.max_output_tokens,
        "max_output_tokens",
        common,
        cache_key=request.prompt_cache_key,
    )
    prepared = with_response_format(
        prepared,
        served,
        (request.text or {}).get("format"),
        "text.format",
        forced_call=forced is not None,
    )
    prepared = with_processors(prepared, forced)
    if LOGPROBS_INCLUDE in (request.include or []):
        if tools:
            raise InvalidRequest(
                "logprobs together with tools are not supported",
                param="include",
                code="unsupported_parameter",
            )
        prepared = with_logprobs(prepared, served, request.top_logprobs or 0)
    prepared = attrs.evolve(prepared, ignored=ignored)
    prepared = with_tools(
        prepared,
        served,
        tools,
        parallel=request.parallel_tool_calls is not False,
        max_calls=request.max_tool_calls,
    )
    return PreparedResponse(request, prepared, items, conversation, truncated_messages=dropped)


def _ignored_hints(request: ResponsesRequest, served: ServedModel) -> tuple[str, ...]:
    """Chat's rule (`_params.ignored_hints`) for the Responses fields, nested ones included."""
    ignored = list(params.ignored_hints(request, _HINTS, strict=served.strict_params))
    nested = {
        "text.verbosity": (request.text or {}).get("verbosity"),
        "stream_options.include_obfuscation": (request.stream_options or {}).get(
            "include_obfuscation"
        ),
    }
    for name, value in nested.items():
        if value is None or value is False:
            continue
        if served.strict_params:
            raise InvalidRequest(
                f"'{name}' is not supported by this server (got {quoted(value)})",
                param=name,
                code="unsupported_parameter",
            )
        ignored.append(name)
    return tuple(ignored)


def _truncated(
    served: ServedModel,
    messages: list[ChatMessage],
    keep: int,
    tools: list[dict[str, Any]],
    max_output_tokens: int | None,
) -> tuple[list[ChatMessage], int]:
    """`truncation: "auto"`: leave out the oldest turns until the prompt and the output budget
    fit the context, as OpenAI does. The first `keep` messages (the instructions) stay, and
    the last turn always does; a turn starts at a user message (templates that insist on
    alternating roles want the rest to start there, and no tool result is left without its
    call), or at any other message but a tool result when there is no user message left.
    A cut the template still refuses counts as not fitting. Still too long: the usual 400."""
    needed = max_output_tokens or 1
    starts = [i for i in range(keep, len(messages)) if messages[i].role == "user"] or [
        i for i in range(keep, len(messages)) if messages[i].role != "tool"
    ]

    def fits(drop: int) -> bool:
        kept = messages[:keep] + messages[starts[drop] :]
        texts = sum(len(t.encode("utf-8")) for t in prompt_texts(kept, tools))
        if served.max_token_bytes and texts > served.context_length * served.max_token_bytes:
            return False  # certainly too long: no need to render it
        try:
            tokens = render_chat(
                served.tokenizer, kept, tools, native_tools=served.tool_format.native
            )
        except InvalidRequest:
            return False
        return len(tokens) + needed <= served.context_length

    if len(starts) <= 1 or fits(0):
        return messages, 0
    low, high = 1, len(starts) - 1  # the fewest turns to drop: tokens fall as turns go
    if not fits(high):
        return messages[:keep] + messages[starts[high] :], starts[high] - keep
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return messages[:keep] + messages[starts[low] :], starts[low] - keep


@attrs.frozen
class _ToolView:
    """The fields `_offered_tools` reads, from a Responses request (flat tool form accepted)."""

    request: ResponsesRequest

    @property
    def tools(self) -> list[Any] | None:
        return self.request.tools

    @property
    def tool_choice(self) -> Any:
        """The Responses API's shapes only (`{"type": "function", "name"}`): the response echoes
        tool_choice, so chat's `{"function": {...}}` form would be echoed in a shape the
        Responses schema does not have."""
        choice = self.request.tool_choice
        if not isinstance(choice, dict):
            return choice
        if "function" in choice:
            raise InvalidRequest(
                "tool_choice names a function as {'type': 'function', 'name': ...}",
                param="tool_choice.function",
                code="invalid_value",
            )
        return choice.get("type") if choice.get("type") in ("none", "auto") else choice


# -- input ------------------------------------------------------------------------------------
def _input_items(raw: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalize input to item resources (with ids), as /input_items returns them."""
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not raw:
        raise InvalidRequest("'input' must not be empty", param="input", code="invalid_value")
    return [_item(f"input[{i}]", item) for i, item in enumerate(raw)]


def _item(where: str, item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise InvalidRequest(
                f"unknown role {quoted(role)}", param=f"{where}.role", code="invalid_value"
            )
        return {
            "type": "message",
            "id": _item_id(where, item, "msg"),
            "role": role,
            "content": _content_parts(where, item.get("content"), role),
            "status": "completed",
        }
    if kind == "function_call":
        _require_str(where, item, "call_id", "name", "arguments")
        return {
            "type": "function_call",
            "id": _item_id(where, item, "fc"),
            "call_id": item["call_id"],
            "name": item["name"],
            "arguments": item["arguments"],
            "status": "completed",
        }
    if kind == "function_call_output":
        _require_str(where, item, "call_id", "output")
        return {
            "type": "function_call_output",
            "id": _item_id(where, item, "fco"),
            "call_id": item["call_id"],
            "output": item["output"],
            "status": "completed",
        }
    if kind == "reasoning":
        content = item.get("content")
        return {
            "type": "reasoning",
            "id": _item_id(where, item, "rs"),
            "summary": _text_parts(f"{where}.summary", item.get("summary")),
            **({"content": _text_parts(f"{where}.content", content)} if content else {}),
        }
    raise InvalidRequest(
        f"input items of type {quoted(kind)} are not supported",
        param=f"{where}.type",
        code="unsupported_parameter",
    )


def _item_id(where: str, item: dict[str, Any], prefix: str) -> str:
    given = item.get("id")
    if given is None or given == "":
        return item_id(prefix)
    if not isinstance(given, str):
        raise InvalidRequest(
            f"'{where}.id' must be a string", param=f"{where}.id", code="invalid_value"
        )
    return given


def _text_parts(where: str, parts: Any) -> list[dict[str, Any]]:
    """A reasoning item's `summary` / `content`: a list of parts, each an object with text."""
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise InvalidRequest(
            f"'{where}' must be a list of text parts", param=where, code="invalid_value"
        )
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise InvalidRequest(
                f"'{where}[{j}]' must be an object with a 'text' string",
                param=f"{where}[{j}]",
                code="invalid_value",
            )
    return parts


def _content_parts(where: str, content: Any, role: str) -> list[dict[str, Any]]:
    text_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        part: dict[str, Any] = {"type": text_type, "text": content}
        return [{**part, "annotations": [], "logprobs": []} if role == "assistant" else part]
    if not isinstance(content, list):
        raise InvalidRequest(
            "message content must be a string or a list of parts",
            param=f"{where}.content",
            code="invalid_value",
        )
    parts = []
    for j, piece in enumerate(content):
        kind = piece.get("type") if isinstance(piece, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(
            piece.get("text"), str
        ):
            raise InvalidRequest(
                f"content parts of type {quoted(kind)} are not supported (text only)",
                param=f"{where}.content[{j}].type",
                code="unsupported_content",
            )
        part = {"type": text_type, "text": piece["text"]}
        parts.append({**part, "annotations": [], "logprobs": []} if role == "assistant" else part)
    return parts


def _require_str(where: str, item: dict[str, Any], *names: str) -> None:
    for name in names:
        if not isinstance(item.get(name), str):
            raise InvalidRequest(
                f"'{where}.{name}' must be a string", param=f"{where}.{name}", code="invalid_value"
            )


def _to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items to chat messages: consecutive function calls join the assistant turn before them."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": "".join(p["text"] for p in item["content"])})
        elif kind == "reasoning":
            text = "".join(
                p.get("text", "") for p in item.get("summary", []) + item.get("content", [])
            )
            if text:
                messages.append({"role": "assistant", "content": text})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    return messages


# -- output -----------------------------------------------------------------------------------
class ResponseBuilder:
    """Builds the output items and, for streams, the events in the order the SDK checks."""

    def __init__(self, prepared: PreparedResponse) -> None:
        self._p = prepared
        self._seq = 0
        self.output: list[dict[str, Any]] = []
        self._message: dict[str, Any] | None = None
        self.usage: Usage | None = None
        self.status = "in_progress"
        self.incomplete_reason: str | None = None

    # events ------------------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self._seq}
        self._seq += 1
        return event

    def opening(self) -> list[dict[str, Any]]:
        snapshot = self.response()
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def text(self, delta: str, logprobs: tuple[LogprobEntry, ...] = ()) -> list[dict[str, Any]]:
        events = []
        if self._message is None:
            self._message = {
                "type": "message",
                "id": item_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.output.append(self._message)
            events.append(
                self._event(
                    "response.output_item.added",
                    output_index=len(self.output) - 1,
                    item=_copy(self._message),
                )
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self._message["content"].append(part)
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=self._message["id"],
                    output_index=len(self.output) - 1,
                    content_index=0,
                    part=_copy(part),
                )
            )
        entries = [e.chat() for e in logprobs]
        self._message["content"][0]["text"] += delta
        self._message["content"][0]["logprobs"] += entries
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self._message["id"],
                output_index=len(self.output) - 1,
                content_index=0,
                delta=delta,
                logprobs=entries,
            )
        )
        return events

    def call(self, call: ToolCallOut) -> list[dict[str, Any]]:
        events = self._close_message()
        item = {
            "type": "function_call",
            "id": item_id("fc"),
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
        }
        self.output.append(item)
        index = len(self.output) - 1
        events.append(
            self._event("response.output_item.added", output_index=index, item=_copy(item))
        )
        events.append(
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=call.arguments,
            )
        )
        item["arguments"] = call.arguments
        events.append(
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=call.name,
                arguments=call.arguments,
            )
        )
        item["status"] = "completed" if call.complete else "incomplete"
        events.append(
            self._event("response.output_item.done", output_index=index, item=_copy(item))
        )
        return events

    def finish(self, finished: Finished) -> list[dict[str, Any]]:
        """Close the open item and settle the status; the final event comes from `final_event`.
        A message cut off by the token budget is `incomplete`, as its response is."""
        cut = finished.reason == "length"
        events = self._close_message("incomplete" if cut else "completed")
        self.usage = finished.usage
        if cut:
            self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
        else:
            self.status = "completed"
        return events

    def final_event(self) -> dict[str, Any]:
        kind = "response.completed" if self.status == "completed" else "response.incomplete"
        return self._event(kind, response=self.response())

    def error_event(self, error: OpenAIError) -> dict[str, Any]:
        self.status = "failed"
        return self._event(
            "error", code=error.code or error.type, message=error.message, param=error.param
        )

    def _close_message(self, status: str = "completed") -> list[dict[str, Any]]:
        message, self._message = self._message, None
        if message is None:
            return []
        index = self.output.index(message)
        part = message["content"][0]
        message["status"] = status
        return [
            self._event(
                "response.output_text.done",
                item_id=message["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=_copy(part["logprobs"]),
            ),
            self._event(
                "response.content_part.done",
                item_id=message["id"],
                output_index=index,
                content_index=0,
                part=_copy(part),
            ),
            self._event("response.output_item.done", output_index=index, item=_copy(message)),
        ]

    # the response object -----------------------------------------------------------------
    def response(self) -> dict[str, Any]:
        p, r = self._p, self._p.request
        response = {
            "id": p.id,
            "object": "response",
            "created_at": p.created_at,
            "status": self.status,
            "error": None,
            "incomplete_details": {"reason": self.incomplete_reason}
            if self.incomplete_reason
            else None,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": r.model,
            "output": _copy(self.output),
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": p.store,
            "temperature": 1.0 if r.temperature is None else r.temperature,
            "text": {"format": _echoed_format((r.text or {}).get("format"))},
            "tool_choice": r.tool_choice if r.tool_choice is not None else "auto",
            "tools": [_flat_tool(t, strict_tool_names(r.tools)) for t in p.prepared.tools],
            "top_p": 1.0 if r.top_p is None else r.top_p,
            **({"top_logprobs": r.top_logprobs} if r.top_logprobs is not None else {}),
            "truncation": r.truncation or "disabled",
            "max_tool_calls": r.max_tool_calls,
            "metadata": r.metadata or {},
        }
        # Absent rather than null: the spec types these as a string and an object.
        if r.user is not None:
            response["user"] = r.user
        if self.usage is not None:
            response["usage"] = _usage(self.usage)
        return response

    def conversation(self) -> list[dict[str, Any]]:
        """The conversation a follow-up replays: this turn's input plus its output."""
        text = "".join(
            item["content"][0]["text"] for item in self.output if item["type"] == "message"
        )
        calls = [
            {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            for item in self.output
            if item["type"] == "function_call"
        ]
        reply: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            reply["tool_calls"] = calls
        return [*self._p.conversation, reply]


def _echoed_format(form: Any) -> dict[str, Any]:
    """`text.format` as the response echoes it: fields sent as null are left out (the spec
    types them as strings and booleans, not nullable)."""
    if not isinstance(form, dict):
        return {"type": "text"}
    return {key: value for key, value in form.items() if value is not None}


def _flat_tool(tool: dict[str, Any], strict: frozenset[str]) -> dict[str, Any]:
    function = tool["function"]
    return {
        "type": "function",
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
        "strict": function["name"] in strict,
    }


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.prompt_tokens - usage.cached_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def input_items_page(
    items: list[dict[str, Any]], *, after: str | None, limit: int, order: str
) -> dict[str, Any]:
    """One page of /input_items, as the spec paginates: `after` an id, newest first by default."""
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit", code="invalid_value")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'", param="order", code="invalid_value")
    ordered = items if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise InvalidRequest(
                f"no input item {quoted(after)} in this response",
                param="after",
                code="invalid_value",
            )
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }
