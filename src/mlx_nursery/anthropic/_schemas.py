"""The Messages API's requests (`POST /v1/messages`, `/v1/messages/count_tokens`): attrs
classes in the order of Anthropic's reference, structured by the project's one converter.

Content blocks, image sources, tools and tool_choice are unions told apart by `type`,
registered on that converter here (`register_tagged_union`). Fields that change nothing
here (`cache_control`, `metadata`) are typed so that a wrong value is still a 400.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ..generation import Tagged, register_tagged_union


@attrs.frozen
class CacheControl:
    """A prompt-cache breakpoint. The prefix cache keeps every prompt's prefix its budget
    allows, breakpoint or not: a hint, named in x-ignored-params."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


@attrs.frozen
class TextBlock:
    text: str
    type: Literal["text"] = "text"
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None
    """Only empty: this server cites no documents."""


@attrs.frozen
class Base64Source:
    media_type: str
    data: str
    type: Literal["base64"] = "base64"


@attrs.frozen
class UrlSource:
    url: str
    type: Literal["url"] = "url"


ImageSource = Base64Source | UrlSource


@attrs.frozen
class ImageBlock:
    source: ImageSource
    type: Literal["image"] = "image"
    cache_control: CacheControl | None = None


@attrs.frozen
class ToolUseBlock:
    """A call the assistant made (replayed by the client with its result)."""

    id: str
    name: str
    input: dict[str, Any]
    type: Literal["tool_use"] = "tool_use"
    cache_control: CacheControl | None = None


@attrs.frozen
class ToolResultBlock:
    tool_use_id: str
    type: Literal["tool_result"] = "tool_result"
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


@attrs.frozen
class ThinkingBlock:
    """An assistant's earlier thinking, sent back: the template's `reasoning_content` of its
    turn. Its `signature` is Anthropic's, unchecked here (this server signs nothing)."""

    thinking: str
    signature: str | None = None
    type: Literal["thinking"] = "thinking"


@attrs.frozen
class RedactedThinkingBlock:
    """Thinking Anthropic's API encrypted: opaque, so there is nothing to render; dropped."""

    data: str
    type: Literal["redacted_thinking"] = "redacted_thinking"


ContentBlock = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


@attrs.frozen
class MessageParam:
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


@attrs.frozen
class Tool:
    """A client tool: the model calls it, the client runs it. Server tools (web search,
    code execution, ...) run on Anthropic's side; their types are refused."""

    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None
    input_examples: list[dict[str, Any]] | None = None
    """Only empty: examples are not shown to the model here."""
    defer_loading: bool | None = None
    """Only false: there is no tool search here to load a tool later."""
    eager_input_streaming: bool | None = None
    """A streaming hint: calls stream whole once parsed, whatever it says."""


@attrs.frozen
class ToolChoiceAuto:
    type: Literal["auto"] = "auto"
    disable_parallel_tool_use: bool | None = None


@attrs.frozen
class ToolChoiceAny:
    type: Literal["any"] = "any"
    disable_parallel_tool_use: bool | None = None


@attrs.frozen
class ToolChoiceTool:
    name: str
    type: Literal["tool"] = "tool"
    disable_parallel_tool_use: bool | None = None


@attrs.frozen
class ToolChoiceNone:
    type: Literal["none"] = "none"


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


@attrs.frozen
class ThinkingConfig:
    """Extended thinking: "enabled" (or "adaptive") turns a thinking template's thinking on,
    "disabled" off (`_prepare.thinking_switch`)."""

    type: str
    budget_tokens: int | None = None
    display: str | None = None


@attrs.frozen
class JsonOutputFormat:
    schema: dict[str, Any]
    type: Literal["json_schema"] = "json_schema"


@attrs.frozen
class OutputConfig:
    format: JsonOutputFormat | None = None
    effort: str | None = None
    """A reasoning effort: a hint for the models served here (x-ignored-params)."""


@attrs.frozen
class Metadata:
    user_id: str | None = None
    """An opaque id of the end user: kept by no one here, it changes no output."""


@attrs.frozen(kw_only=True)
class ConversationFields:
    """What a message request and a token count share: the prompt and what shapes it."""

    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None
    speed: Literal["standard"] | None = None
    """Only "standard": there is one speed here ("fast" is a faster tier of Anthropic's)."""
    user_profile_id: Any = None
    """Accepted and ignored (a message request names it in x-ignored-params), as the next two."""
    workspace_id: Any = None
    context_management: Any = None


@attrs.frozen(kw_only=True)
class CountTokensRequest(ConversationFields):
    pass


@attrs.frozen(kw_only=True)
class MessagesRequest(ConversationFields):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    """Both mean the default class here (priority 0; `priority` sets another)."""
    priority: int | None = None
    """Not Anthropic's: the place in the queue, lower first (vLLM's extension field)."""
    container: Any = None
    """Unsupported (no code execution here): a 400 unless null, as the next two."""
    diagnostics: Any = None
    inference_geo: Any = None


register_tagged_union(
    ContentBlock.__args__,
    Tagged(
        {
            "text": TextBlock,
            "image": ImageBlock,
            "tool_use": ToolUseBlock,
            "tool_result": ToolResultBlock,
            "thinking": ThinkingBlock,
            "redacted_thinking": RedactedThinkingBlock,
        },
        "content blocks of type {tag} are not supported (text, image, tool_use, "
        "tool_result, thinking and redacted_thinking are)",
        code="unsupported_content",
    ),
)
register_tagged_union(
    (TextBlock, ImageBlock),
    Tagged(
        {"text": TextBlock, "image": ImageBlock},
        "tool_result content blocks of type {tag} are not supported (text and image are)",
        code="unsupported_content",
    ),
)
register_tagged_union(
    ImageSource.__args__,
    Tagged(
        {"base64": Base64Source, "url": UrlSource},
        "image sources of type {tag} are not supported (base64 and url are; this server has "
        "no files API)",
        code="unsupported_content",
    ),
)
register_tagged_union(
    (Tool,),
    Tagged(
        {"custom": Tool},
        "tool type {tag} is not supported: this server runs no server tools; define a "
        "client tool (name, description, input_schema)",
        default=Tool,
    ),
)
register_tagged_union(
    ToolChoice.__args__,
    Tagged(
        {
            "auto": ToolChoiceAuto,
            "any": ToolChoiceAny,
            "tool": ToolChoiceTool,
            "none": ToolChoiceNone,
        },
        "invalid tool_choice type {tag}",
        code="invalid_value",
    ),
)
