"""/v1/chat/completions: the request we accept and the objects we send back.

Every field OpenAI defines for the endpoint is declared, so that a field we do not implement
is rejected by name (see `_params.reject_unimplemented`) rather than failing as
"unrecognized". Fields that are not OpenAI's but are common among local servers (top_k,
min_p, repetition_penalty) are ours.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ..generation import (
    ChatMessage,
    FunctionTool,
    NamedToolChoice,
    ResponseFormat,
    SamplingFields,
    ToolChoiceMode,
)
from ._usage import UsageOut


@attrs.define(kw_only=True)
class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoiceMode | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None
    service_tier: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None
    moderation: Any = None
    safety_identifier: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's: more variables for the model's chat template (`template_variables`)."""


# -- what we send back ------------------------------------------------------------------------
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
    reasoning_content: str | None = None
    """A thinking model's reasoning (not OpenAI's: vLLM's and llama.cpp's name); left out
    for a model that does not think."""


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
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    refusal: None = None
    """Never set (no refusals here); the first delta carries it as null, as OpenAI's."""


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
