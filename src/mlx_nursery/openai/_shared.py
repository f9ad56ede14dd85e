"""Request schemas that chat, completions and the Responses API share: sampling fields, function
tools, tool_choice objects and the plain output formats.

Plain attrs classes in the OpenAI docs' field order; `_converter` structures them (the tagged
unions on `type` are registered there).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ._script_schema import ScriptSpec

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
    script: ScriptSpec | None = None
    """This server's extension: the scripted model's script (`_scripts`); other models refuse it."""


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
