"""The request parts every API's plan is built from: sampling fields, function tools,
tool_choice objects, chat messages (the form a chat template renders), the output formats,
and the ids and timestamps of generated objects.

They are written as OpenAI's chat request writes them (field order as its docs), the form the
Anthropic adapter converts its requests into; `_converter` structures them (the tagged unions
on `type` are registered there).
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

import attrs

ToolChoiceMode = Literal["none", "auto", "required"]


@attrs.define
class StreamOptions:
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


@attrs.define
class SamplingFields:
    """Fields chat and completions share; see `_params.sampling_from`."""

    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    user: str | None = None
    priority: int | None = None
    """The request's place in the server's queue, lower first (vLLM's extension field: not
    OpenAI's; every API here takes it, `_params.request_priority`)."""


@attrs.frozen
class FunctionDefinition:
    """Chat's `tools[].function`."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@attrs.frozen
class FunctionTool:
    """A function tool in chat's nested form (`function`) or the Responses API's flat form
    (`name`, `parameters`, ... beside `type`); both APIs accept both, as they always have here."""

    type: Literal["function"] = "function"
    function: FunctionDefinition | None = None
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @property
    def spec(self) -> FunctionDefinition | FunctionTool:
        """Where the definition is: the nested `function`, else the flat tool itself."""
        return self.function if self.function is not None else self


@attrs.frozen
class FunctionName:
    name: str


@attrs.frozen
class NamedToolChoice:
    """`{"type": "function", "function": {"name"}}` (chat) or `{"type": "function", "name"}`
    (Responses; chat accepts it too)."""

    type: Literal["function"] = "function"
    function: FunctionName | None = None
    name: str | None = None


@attrs.frozen
class ToolChoiceType:
    """The Responses API's `{"type": "none" | "auto"}`, the same as the bare string."""

    type: Literal["none", "auto"]


@attrs.frozen
class TextFormat:
    type: Literal["text"] = "text"


@attrs.frozen
class JsonObjectFormat:
    type: Literal["json_object"] = "json_object"


Role = Literal["system", "developer", "user", "assistant", "tool"]


@attrs.define
class ContentPart:
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


@attrs.define
class ChatMessage:
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    function_call: Any = None
    audio: Any = None
    reasoning_content: str | None = None
    """An assistant turn's reasoning sent back (a thinking template may render it)."""
    reasoning: str | None = None
    """The same, by the name vLLM and OpenRouter use."""


def last_user_text(messages: list[ChatMessage]) -> str:
    """The text of the last user message (its text parts joined): `Prepared.user_text`."""
    for message in reversed(messages):
        if message.role != "user":
            continue
        if isinstance(message.content, str):
            return message.content
        return "".join(part.text or "" for part in message.content or [] if part.type == "text")
    return ""


@attrs.frozen
class JsonSchemaSpec:
    """`response_format.json_schema`."""

    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


@attrs.frozen
class JsonSchemaFormat:
    json_schema: JsonSchemaSpec
    type: Literal["json_schema"] = "json_schema"


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat
"""A tagged union on `type` (`_converter`)."""


@attrs.frozen
class TextJsonSchemaFormat:
    """`text.format` for a JSON schema: chat's `json_schema` object, flattened."""

    name: str
    schema: dict[str, Any]
    type: Literal["json_schema"] = "json_schema"
    description: str | None = None
    strict: bool | None = None


TextFormatParam = TextFormat | JsonObjectFormat | TextJsonSchemaFormat
"""A tagged union on `type` (`_converter`)."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())
