"""/v1/responses: the request we accept, its input items included.

Input items are a tagged union on `type` (`_converter`): a message (the default when `type`
is missing, as OpenAI's "easy" input message), a function call, a function call's output, a
reasoning item. Items tolerate fields we do not read: clients send back the output items they
received, with fields such as `status` and `annotations`.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ..generation import (
    FunctionTool,
    NamedToolChoice,
    TextFormatParam,
    ToolChoiceMode,
    ToolChoiceType,
)

ItemRole = Literal["user", "system", "developer", "assistant"]


@attrs.frozen
class TextPart:
    """A message's content part: `input_text`, `output_text` (replayed), or `text`."""

    type: Literal["input_text", "output_text", "text"]
    text: str


@attrs.frozen
class ImagePart:
    """A message's `input_image` part: by URL (data: or an allowed file:); `file_id` names a
    file of OpenAI's files API, which this server does not have."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


ContentPart = TextPart | ImagePart
"""A tagged union on `type` (`_converter`)."""


@attrs.frozen
class ReasoningText:
    """A reasoning item's `summary` or `content` part (`summary_text`, `reasoning_text`)."""

    text: str
    type: str | None = None


@attrs.frozen
class MessageItem:
    role: ItemRole
    content: str | list[ContentPart]
    id: str | None = None
    type: Literal["message"] = "message"


@attrs.frozen
class FunctionCallItem:
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    type: Literal["function_call"] = "function_call"


@attrs.frozen
class FunctionCallOutputItem:
    call_id: str
    output: str | list[ContentPart]
    """Text, or parts (what a tool returned: text, images), as the spec allows."""
    id: str | None = None
    type: Literal["function_call_output"] = "function_call_output"


@attrs.frozen
class ReasoningItem:
    summary: list[ReasoningText] = attrs.Factory(list)
    content: list[ReasoningText] | None = None
    id: str | None = None
    type: Literal["reasoning"] = "reasoning"


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
"""A tagged union on `type` (`_converter`); a missing `type` is a message."""


@attrs.frozen
class TextConfig:
    format: TextFormatParam | None = None
    verbosity: str | None = None


@attrs.frozen
class ResponsesStreamOptions:
    include_obfuscation: bool | None = None


@attrs.define(kw_only=True)
class ResponsesRequest:
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoiceMode | NamedToolChoice | ToolChoiceType | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    text: TextConfig | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool | None = None
    stream_options: ResponsesStreamOptions | None = None
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
    prompt_cache_options: Any = None
    moderation: Any = None
    context_management: Any = None
    background_options: Any = None
    access_programs: Any = None
    image: Any = None
    priority: int | None = None
    """Not OpenAI's: the place in the queue, lower first (vLLM's; `SamplingFields.priority`)."""
