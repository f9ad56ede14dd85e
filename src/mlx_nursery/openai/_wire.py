"""Wire schemas of what we send back: attrs classes, unstructured by the one converter."""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

import attrs

from ..engine import Usage
from ._converter import converter


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


@attrs.frozen
class PromptTokensDetails:
    cached_tokens: int


@attrs.frozen
class UsageOut:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, usage: Usage) -> UsageOut:
        return cls(
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.total_tokens,
            PromptTokensDetails(usage.cached_tokens),
        )


@attrs.frozen
class FunctionCall:
    name: str
    arguments: str


@attrs.frozen
class ToolCall:
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


@attrs.frozen
class AssistantMessage:
    content: str | None
    role: Literal["assistant"] = "assistant"
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


@attrs.frozen
class ChatChoice:
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: dict[str, Any] | None = None


@attrs.frozen
class ChatCompletion:
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageOut
    object: Literal["chat.completion"] = "chat.completion"


@attrs.frozen
class ChatDelta:
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


@attrs.frozen
class ChunkChoice:
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


@attrs.frozen
class ChatCompletionChunk:
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageOut | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


@attrs.frozen
class CompletionChoice:
    index: int
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


@attrs.frozen
class Completion:
    """Both the body and the stream chunks of /v1/completions (OpenAI uses one shape)."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageOut | None = None
    object: Literal["text_completion"] = "text_completion"


@attrs.frozen
class ModelCard:
    id: str
    created: int
    context_length: int
    owned_by: str = "mlx-nursery"
    object: Literal["model"] = "model"


@attrs.frozen
class ModelList:
    data: list[ModelCard]
    object: Literal["list"] = "list"


def _without_tool_calls_if_none(message: AssistantMessage) -> dict[str, Any]:
    out = {"content": message.content, "role": message.role, "refusal": message.refusal}
    if message.tool_calls is not None:
        out["tool_calls"] = converter.unstructure(message.tool_calls)
    return out


converter.register_unstructure_hook(AssistantMessage, _without_tool_calls_if_none)
converter.register_unstructure_hook(
    ChatDelta,
    # OpenAI leaves unset delta fields out: `{"content": "x"}`, and `{}` on the final chunk.
    lambda delta: {k: v for k, v in attrs.asdict(delta).items() if v is not None},
)


def to_json(value: Any) -> Any:
    return converter.unstructure(value)
