"""Prompts to token ids: chat messages through the model's chat template, raw completion prompts."""

from __future__ import annotations

from typing import Any

from ._errors import InvalidRequest
from ._schemas import ChatMessage, CompletionRequest


def render_chat(tokenizer: Any, messages: list[ChatMessage]) -> list[int]:
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages",
                             code="invalid_value")
    rendered = [_message(i, m) for i, m in enumerate(messages)]
    try:
        tokens = tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # noqa: BLE001 - a template's own check (e.g. role order) is the client's
        raise InvalidRequest(f"the model's chat template rejected the messages: {exc}",
                             param="messages", code="invalid_value") from None
    # transformers 5 returns a BatchEncoding-like mapping for tokenize=True
    if isinstance(tokens, dict) or hasattr(tokens, "input_ids"):
        tokens = tokens["input_ids"]
    return list(tokens)


def _message(index: int, message: ChatMessage) -> dict[str, Any]:
    where = f"messages[{index}]"
    for name in ("tool_calls", "function_call", "audio"):
        if getattr(message, name):
            raise InvalidRequest(f"'{where}.{name}' is not supported yet", param=f"{where}.{name}",
                                 code="unsupported_parameter")
    if message.role == "tool":
        raise InvalidRequest("tool messages are not supported yet", param=f"{where}.role",
                             code="unsupported_parameter")
    role = "system" if message.role == "developer" else message.role
    rendered: dict[str, Any] = {"role": role, "content": _text(where, message)}
    if message.name:
        rendered["name"] = message.name
    return rendered


def _text(where: str, message: ChatMessage) -> str:
    content = message.content
    if content is None:
        if message.role != "assistant":
            raise InvalidRequest(f"'{where}.content' is required for role {message.role!r}",
                                 param=f"{where}.content", code="invalid_value")
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                f"content parts of type {part.type!r} are not supported (text only)",
                param=f"{where}.content[{j}].type", code="unsupported_content",
            )
        pieces.append(part.text)
    return "".join(pieces)


def completion_tokens(tokenizer: Any, request: CompletionRequest, vocab_size: int) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise InvalidRequest("one prompt per request is supported (a list of several was given)",
                                 param="prompt", code="unsupported_parameter")
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens = list(tokenizer.encode(prompt))
    else:
        tokens = list(prompt)
        bad = [t for t in tokens if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})",
                                 param="prompt", code="invalid_value")
    if not tokens:
        raise InvalidRequest("the prompt is empty", param="prompt", code="invalid_value")
    return tokens
