"""Responses input items (typed, `_responses_schemas`) to the item resources /input_items
returns and stores, and those to chat messages."""

from __future__ import annotations

import secrets
from typing import Any

from ._errors import InvalidRequest
from ._responses_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    ReasoningItem,
    ReasoningText,
    TextPart,
)


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def input_items(raw: str | list[InputItem]) -> list[dict[str, Any]]:
    """Normalize input to item resources (with ids), as /input_items returns them."""
    if isinstance(raw, str):
        raw = [MessageItem(role="user", content=raw)]
    if not raw:
        raise InvalidRequest("'input' must not be empty", param="input", code="invalid_value")
    return [_resource(item) for item in raw]


def _resource(item: InputItem) -> dict[str, Any]:
    if isinstance(item, MessageItem):
        return {
            "type": "message",
            "id": item.id or item_id("msg"),
            "role": item.role,
            "content": _content_parts(item.content, item.role),
            "status": "completed",
        }
    if isinstance(item, FunctionCallItem):
        return {
            "type": "function_call",
            "id": item.id or item_id("fc"),
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments,
            "status": "completed",
        }
    if isinstance(item, FunctionCallOutputItem):
        return {
            "type": "function_call_output",
            "id": item.id or item_id("fco"),
            "call_id": item.call_id,
            "output": item.output,
            "status": "completed",
        }
    return _reasoning(item)


def _reasoning(item: ReasoningItem) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "type": "reasoning",
        "id": item.id or item_id("rs"),
        "summary": _text_parts(item.summary),
    }
    if item.content:
        resource["content"] = _text_parts(item.content)
    return resource


def _text_parts(parts: list[ReasoningText]) -> list[dict[str, Any]]:
    return [{"type": p.type, "text": p.text} if p.type else {"text": p.text} for p in parts]


def _content_parts(content: str | list[TextPart], role: str) -> list[dict[str, Any]]:
    text_type = "output_text" if role == "assistant" else "input_text"
    texts = [content] if isinstance(content, str) else [part.text for part in content]
    if role == "assistant":
        return [{"type": text_type, "text": t, "annotations": [], "logprobs": []} for t in texts]
    return [{"type": text_type, "text": t} for t in texts]


def to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
