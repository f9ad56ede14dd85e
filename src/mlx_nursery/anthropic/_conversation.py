"""A Messages conversation (system, messages of content blocks) as the chat template's own
messages (`generation.render_served_template`'s shape), with its images taken in order.

How blocks map: text blocks of a message join into its content (parts, when it holds
images); an assistant's `tool_use` blocks become its `tool_calls`; a user's `tool_result`
blocks become `tool` messages, in place, before the rest of that user turn. A result with
`is_error` reads "Error: ..." (templates have no such flag). `system` (a string or text
blocks) is the first system message; system blocks are joined with a blank line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ..generation import ImageRef, ImageTaker, InvalidRequest
from ._schemas import (
    Base64Source,
    ConversationFields,
    ImageBlock,
    MessageParam,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UrlSource,
)

IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


def template_messages(
    request: ConversationFields, images: ImageTaker
) -> tuple[list[dict[str, Any]], bool]:
    """The conversation in the template's shape, and whether its last message is an
    assistant's reply to continue (a prefill). Decodes images: a worker thread."""
    if not request.messages:
        raise InvalidRequest(
            "messages: at least one message is required", param="messages", code="invalid_value"
        )
    rendered: list[dict[str, Any]] = []
    system = _system_text(request.system)
    if system is not None:
        rendered.append({"role": "system", "content": system})
    for i, message in enumerate(request.messages):
        rendered.extend(_message(f"messages[{i}]", message, images))
    last = request.messages[-1]
    prefill = last.role == "assistant" and "tool_calls" not in rendered[-1]
    return rendered, prefill


def conversation_texts(request: ConversationFields) -> Iterator[str]:
    """The text the template certainly renders (for the size check before tokenizing)."""
    system = _system_text(request.system)
    if system:
        yield system
    for message in request.messages:
        blocks = (
            [TextBlock(message.content)] if isinstance(message.content, str) else message.content
        )
        for block in blocks:
            if isinstance(block, TextBlock):
                yield block.text
            elif isinstance(block, ToolUseBlock):
                yield json.dumps(block.input, ensure_ascii=False)
            elif isinstance(block, ToolResultBlock):
                if isinstance(block.content, str):
                    yield block.content
                for part in block.content if isinstance(block.content, list) else ():
                    if isinstance(part, TextBlock):
                        yield part.text


def _system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    for j, block in enumerate(system):
        _check_citations(block, f"system[{j}]")
    return "\n\n".join(block.text for block in system) or None


def _message(where: str, message: MessageParam, images: ImageTaker) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []

    def flush() -> None:
        if parts or calls or thoughts:
            turn: dict[str, Any] = {"role": message.role, "content": _content(parts)}
            if calls:
                turn["tool_calls"] = list(calls)
            if thoughts:  # where a thinking template renders it (others leave it out)
                turn["reasoning_content"] = "\n\n".join(thoughts)
            out.append(turn)
            parts.clear()
            calls.clear()
            thoughts.clear()

    for j, block in enumerate(message.content):
        here = f"{where}.content[{j}]"
        if isinstance(block, TextBlock):
            _check_citations(block, here)
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            _only(message.role, ("user",), "image", here)
            parts.append(_image(block, here, images))
        elif isinstance(block, ToolUseBlock):
            _only(message.role, ("assistant",), "tool_use", here)
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": block.input},
                }
            )
        elif isinstance(block, ThinkingBlock):
            _only(message.role, ("assistant",), "thinking", here)
            thoughts.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            _only(message.role, ("assistant",), "redacted_thinking", here)
        else:
            _only(message.role, ("user",), "tool_result", here)
            flush()
            out.append(_tool_result(block, here))
    flush()
    if not out:  # an empty content list: an empty turn, as the template renders ""
        out.append({"role": message.role, "content": ""})
    return out


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text alone joins into a string (what every template renders); parts with images
    stay parts, in order."""
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return list(parts)


def _tool_result(block: ToolResultBlock, where: str) -> dict[str, Any]:
    if isinstance(block.content, list):
        pieces = []
        for k, part in enumerate(block.content):
            if isinstance(part, ImageBlock):
                raise InvalidRequest(
                    "images in tool results are not supported; send the image in a user "
                    "message's image block",
                    param=f"{where}.content[{k}].type",
                    code="unsupported_content",
                )
            _check_citations(part, f"{where}.content[{k}]")
            pieces.append(part.text)
        text = "".join(pieces)
    else:
        text = block.content or ""
    if block.is_error:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def _image(block: ImageBlock, where: str, images: ImageTaker) -> dict[str, Any]:
    source = block.source
    if isinstance(source, Base64Source):
        if source.media_type not in IMAGE_MEDIA_TYPES:
            raise InvalidRequest(
                f"source.media_type must be one of {', '.join(sorted(IMAGE_MEDIA_TYPES))}",
                param=f"{where}.source.media_type",
                code="invalid_image",
            )
        url = f"data:{source.media_type};base64,{source.data}"
        return images.take_url(url, where, f"{where}.source.data")
    return images.take_url(source.url, where, f"{where}.source.url")


def _only(role: str, allowed: tuple[str, ...], kind: str, where: str) -> None:
    if role not in allowed:
        raise InvalidRequest(
            f"{kind} blocks belong in {' or '.join(allowed)} messages, not {role} ones",
            param=f"{where}.type",
            code="invalid_value",
        )


def _check_citations(block: TextBlock, where: str) -> None:
    if block.citations:
        raise InvalidRequest(
            "citations are not supported: this server cites no documents",
            param=f"{where}.citations",
            code="unsupported_parameter",
        )


def image_urls(request: ConversationFields) -> Iterator[ImageRef]:
    """The request's image blocks, by URL (a base64 block as a bare "data:"): the server
    counts them, and fetches the http(s) ones from the hosts it allows, before the request
    is prepared."""
    for i, message in enumerate(request.messages):
        for j, block in enumerate(message.content if isinstance(message.content, list) else ()):
            if not isinstance(block, ImageBlock):
                continue
            part = f"messages[{i}].content[{j}]"
            if isinstance(block.source, UrlSource):
                yield ImageRef(block.source.url, part, f"{part}.source.url")
            else:
                yield ImageRef("data:", part, f"{part}.source.data")
