"""The Responses API's output: output items and the stream's events, in the order the SDK
checks, and the /input_items pages."""

from __future__ import annotations

from typing import Any

from ..engine import Usage
from ._converter import to_json, without_nulls
from ._errors import InvalidRequest, OpenAIError, quoted
from ._generation import Finished
from ._logprobs import LogprobEntry
from ._responses import PreparedResponse
from ._responses_items import item_id
from ._responses_schemas import TextFormatParam
from ._tools import ToolCallOut, strict_tool_names


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
            "text": {"format": _echoed_format(r.text.format if r.text else None)},
            "tool_choice": _echoed_choice(r.tool_choice),
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


def _echoed_format(form: TextFormatParam | None) -> dict[str, Any]:
    """`text.format` as the response echoes it: fields sent as null are left out (the spec
    types them as strings and booleans, not nullable)."""
    return {"type": "text"} if form is None else without_nulls(form)


def _echoed_choice(choice: Any) -> Any:
    return "auto" if choice is None else choice if isinstance(choice, str) else to_json(choice)


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
