"""Responses input items (typed, `_responses_schemas`) to the item resources /input_items
returns and stores, those to chat messages, and the /input_items pages."""

from __future__ import annotations

import secrets
from typing import Any, Literal

from ..generation import InvalidRequest, quoted, to_json
from ._responses_objects import InputItemList
from ._responses_schemas import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    ImagePart,
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
    return [_resource(item, f"input[{i}]") for i, item in enumerate(raw)]


def _resource(item: InputItem, where: str) -> dict[str, Any]:
    if isinstance(item, MessageItem):
        return {
            "type": "message",
            "id": item.id or item_id("msg"),
            "role": item.role,
            "content": _content_parts(item.content, item.role, where),
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
            "output": (
                item.output
                if isinstance(item.output, str)
                else _content_parts(item.output, "user", f"{where}.output")
            ),
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


def _content_parts(content: str | list[ContentPart], role: str, where: str) -> list[dict[str, Any]]:
    text_type: Literal["output_text", "input_text"] = (
        "output_text" if role == "assistant" else "input_text"
    )
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(
        [TextPart(text_type, content)] if isinstance(content, str) else content
    ):
        if isinstance(part, ImagePart):
            parts.append(_image_part(part, role, f"{where}.content[{j}]"))
        elif role == "assistant":
            parts.append({"type": text_type, "text": part.text, "annotations": [], "logprobs": []})
        else:
            parts.append({"type": text_type, "text": part.text})
    return parts


def _image_part(part: ImagePart, role: str, where: str) -> dict[str, Any]:
    if role == "assistant":
        raise InvalidRequest(
            "only user, system and developer messages carry images",
            param=f"{where}.type",
            code="invalid_value",
        )
    if part.file_id is not None:
        raise InvalidRequest(
            "images by file_id are not supported: this server has no files API; send "
            "image_url (a data: URL)",
            param=f"{where}.file_id",
            code="unsupported_parameter",
        )
    if part.image_url is None:
        raise InvalidRequest(
            "an input_image part needs its image_url",
            param=f"{where}.image_url",
            code="missing_required_parameter",
        )
    return {"type": "input_image", "image_url": part.image_url, "detail": part.detail or "auto"}


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """An item's content as chat content: its text, or, with images, chat's parts in order."""
    if all(p["type"] != "input_image" for p in parts):
        return "".join(p["text"] for p in parts)
    return [
        {"type": "image_url", "image_url": {"url": p["image_url"]}}
        if p["type"] == "input_image"
        else {"type": "text", "text": p["text"]}
        for p in parts
    ]


def to_messages(items: list[dict[str, Any]], *, thinking: bool = False) -> list[dict[str, Any]]:
    """Items to chat messages: consecutive function calls join the assistant turn before them.

    A reasoning item is assistant context: for a thinking model (`thinking`), the
    `reasoning_content` of the assistant turn it precedes (the message or calls that follow
    join it), which a thinking template renders where its model expects it; for other
    models, an assistant message of its text."""
    return messages_and_origins(items, thinking=thinking)[0]


def messages_and_origins(
    items: list[dict[str, Any]], *, thinking: bool = False
) -> tuple[list[dict[str, Any]], list[int]]:
    """`to_messages`, and for each message the index of the item that started it (errors
    name a message by the item it came from). One pass over the items."""
    messages: list[dict[str, Any]] = []
    origins: list[int] = []
    for k, item in enumerate(items):
        _add_item(messages, item, thinking=thinking)
        origins += [k] * (len(messages) - len(origins))
    return messages, origins


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], *, thinking: bool) -> None:
    """Append the message `item` starts, or join it to the last message."""
    kind = item["type"]
    last = messages[-1] if messages else None
    if kind == "message":
        role = "system" if item["role"] == "developer" else item["role"]
        content = _chat_content(item["content"])
        if role == "assistant" and last is not None and _only_reasoning(last):
            last["content"] = content
        else:
            messages.append({"role": role, "content": content})
    elif kind == "reasoning":
        text = "".join(p.get("text", "") for p in item.get("summary", []) + item.get("content", []))
        if text and thinking:
            messages.append({"role": "assistant", "content": None, "reasoning_content": text})
        elif text:
            messages.append({"role": "assistant", "content": text})
    elif kind == "function_call":
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    else:
        output = item["output"]
        content = output if isinstance(output, str) else _chat_content(output)
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})


def _only_reasoning(message: dict[str, Any]) -> bool:
    """An assistant turn that holds a reasoning item only, so far."""
    return (
        message["role"] == "assistant"
        and "reasoning_content" in message
        and message["content"] is None
        and not message.get("tool_calls")
    )


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
    body: dict[str, Any] = to_json(
        InputItemList(
            data=page,
            first_id=page[0]["id"] if page else None,
            last_id=page[-1]["id"] if page else None,
            has_more=len(ordered) > limit,
        )
    )
    return body
