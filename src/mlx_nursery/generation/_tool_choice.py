"""Which tools the model is shown, and what `tool_choice` forces (chat and Responses)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import InvalidRequest, quoted
from ._params import check_count
from ._request_parts import FunctionTool, NamedToolChoice, ToolChoiceMode
from ._served import ServedModel
from ._tools import normalize_tools, strict_tool_names

if TYPE_CHECKING:
    from ..engine import GrammarProcessor


def shown_tools(raw: list[FunctionTool] | None, served: ServedModel) -> list[dict[str, Any]]:
    """The tools as the chat template is shown them (within `--max-tools`)."""
    check_count(len(raw or ()), served.caps.max_tools, "tools")
    return normalize_tools(raw)


def prompted_tools(
    raw: list[FunctionTool] | None,
    choice: ToolChoiceMode | NamedToolChoice | None,
    served: ServedModel,
) -> list[dict[str, Any]]:
    """The tools the chat template is shown under `choice`, checked as `offered_tools`
    checks a choice, without building the constraint on the calls (/tokenize's use: the
    prompt alone)."""
    tools, _ = _checked(raw, choice, served)
    return [] if choice == "none" else tools


def _checked(
    raw: list[FunctionTool] | None,
    choice: ToolChoiceMode | NamedToolChoice | None,
    served: ServedModel,
) -> tuple[list[dict[str, Any]], str | None]:
    """The tools as shown, and the function a named choice forces (None: none), once the
    choice is checked: a named function must be among the tools, a forced call needs one."""
    tools = shown_tools(raw, served)
    name = _forced_name(choice, tools) if isinstance(choice, NamedToolChoice) else None
    if forces_call(choice) and not tools:
        raise InvalidRequest(
            "tool_choice 'required' needs tools to call", param="tool_choice", code="invalid_value"
        )
    return tools, name


def forces_call(choice: ToolChoiceMode | NamedToolChoice | None) -> bool:
    """Whether a tool_choice forces a call: "required", or a named function."""
    return choice not in (None, "auto", "none")


def offered_tools(
    raw: list[FunctionTool] | None,
    choice: ToolChoiceMode | NamedToolChoice | None,
    served: ServedModel,
) -> tuple[list[dict[str, Any]], GrammarProcessor | None]:
    """The tools the model is shown, and the constraint on its calls (or None).

    tool_choice: "none" shows no tools; "auto" (default) lets the model choose; "required" and
    a named function force exactly one call by constrained decoding, with arguments valid
    against the tool's parameters. Under "auto", `strict: true` tools are enforced lazily:
    free text until the model opens a call, then a call whose arguments follow the schema
    (`Grammars.strict_tools_processor`). Constraints need a JSON call format (the model's own,
    or the fallback convention). A tool_choice is checked with or without tools: one that
    forces a call needs a tool to call.
    """
    tools, name = _checked(raw, choice, served)
    forcing = forces_call(choice)
    if choice == "none" or not tools:
        return [], None
    form = served.tool_format
    markup = (form.start, form.end)
    strict = strict_tool_names(raw)
    if not forcing and not strict:
        return tools, None
    if not form.json or served.grammars is None:
        what = "tool_choice 'required' or a named function" if forcing else "strict tools"
        raise InvalidRequest(
            f"{what} can be enforced only for models with the <tool_call> JSON format",
            param="tool_choice" if forcing else "tools",
            code="unsupported_parameter",
        )
    if not forcing:
        return tools, served.grammars.strict_tools_processor(tools, strict, markup, "tools")
    return tools, served.grammars.tool_call_processor(tools, markup, "tool_choice", name=name)


def _forced_name(choice: NamedToolChoice, tools: list[dict[str, Any]]) -> str:
    """The function a tool_choice names: chat's `{"type": "function", "function": {"name"}}`
    or the Responses API's `{"type": "function", "name"}`."""
    name = choice.function.name if choice.function is not None else choice.name
    if name is None:
        raise InvalidRequest(
            "tool_choice must name a function", param="tool_choice", code="invalid_value"
        )
    if name in {t["function"]["name"] for t in tools}:
        return name
    raise InvalidRequest(
        f"tool_choice names {quoted(name)}, which is not among the tools",
        param="tool_choice",
        code="invalid_value",
    )
