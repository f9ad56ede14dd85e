"""Tools as a model's template meets them: definitions normalized, the format a model writes
calls in (`ToolFormat`: mlx-lm's parser for its template, else the Hermes fallback), and call
arguments made ready for a template. Calls are read back out of the text by `_tool_calls`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ._converter import structure
from ._errors import InvalidRequest
from ._json import TOO_DEEP, parse_json
from ._request_parts import FunctionTool


@attrs.frozen
class ToolFormat:
    """How a model writes tool calls: the markup around a call and the parser of its body.

    `native`: the model's own chat template renders tools and calls, and mlx-lm knows its
    parser. Otherwise (the built-in SmolLM2 among such models) the server uses one fallback
    convention, Hermes' (`FALLBACK_TOOLS_PROMPT`): tools described in the system message, a
    call as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, a result as a user
    turn in `<tool_response>` tags. `json`: the call's body is that JSON object, which
    constrained decoding can enforce (tool_choice required or named, strict tools)."""

    start: str
    end: str
    parse: Callable[[str, Any], Any]
    native: bool
    json: bool


def tool_format(tokenizer: Any) -> ToolFormat:
    """The model's tool-call format (mlx-lm's, from its chat template), or the fallback."""
    from mlx_lm.tool_parsers import json_tools

    if getattr(tokenizer, "has_tool_calling", False):
        parser = tokenizer.tool_parser
        return ToolFormat(
            tokenizer.tool_call_start,
            tokenizer.tool_call_end,
            parser,
            native=True,
            json=getattr(parser, "__module__", "").endswith("json_tools"),
        )
    return ToolFormat(
        json_tools.tool_call_start,
        json_tools.tool_call_end,
        json_tools.parse_tool_call,
        native=False,
        json=True,
    )


FALLBACK_TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""  # noqa: E501 - the prompt Hermes models were trained on, verbatim


def fallback_messages(
    rendered: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Messages in the fallback convention for a template that knows no tools: the tools in
    the system message, calls in the assistant's text, results as user turns."""
    out: list[dict[str, Any]] = []
    for message in rendered:
        message = dict(message)
        calls = message.pop("tool_calls", None)
        if calls:
            text = "\n".join(_fallback_call(call["function"]) for call in calls)
            message["content"] = f"{message['content']}\n{text}" if message.get("content") else text
        if message["role"] == "tool":
            message = {
                "role": "user",
                "content": f"<tool_response>\n{message['content']}\n</tool_response>",
            }
            message.pop("tool_call_id", None)
        out.append(message)
    if tools:
        described = FALLBACK_TOOLS_PROMPT.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        )
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _fallback_call(function: dict[str, Any]) -> str:
    arguments = function.get("arguments", {})
    body = {"name": function["name"], "arguments": arguments}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def strict_tool_names(tools: Sequence[FunctionTool] | None) -> frozenset[str]:
    """The tools marked `strict: true` (chat's nested form or the Responses flat form)."""
    return frozenset(
        t.spec.name for t in tools or () if t.spec.strict is True and t.spec.name is not None
    )


def normalize_tools(
    raw: Sequence[FunctionTool | Mapping[str, Any]] | None, param: str = "tools"
) -> list[dict[str, Any]]:
    """The nested form that chat templates expect,
    {"type": "function", "function": {name, description, parameters}}, from chat's nested
    form or the Responses API's flat form (a mapping is structured first, as a request's)."""
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(raw or []):
        where = f"{param}[{i}]"
        if not isinstance(tool, FunctionTool):
            tool = structure(tool, FunctionTool, where)
        spec = tool.spec
        if not spec.name:
            name = f"{where}.function.name" if tool.function is not None else f"{where}.name"
            raise InvalidRequest(
                f"'{where}' needs a function name", param=name, code="invalid_value"
            )
        parameters = spec.parameters
        function: dict[str, Any] = {
            "name": spec.name,
            "parameters": {"type": "object", "properties": {}}
            if parameters is None
            else parameters,
        }
        if spec.description:
            function["description"] = spec.description
        tools.append({"type": "function", "function": function})
    return tools


def call_arguments_for_template(arguments: Any, param: str) -> Any:
    """Templates expect arguments as a mapping (most apply `tojson`): decode a JSON string once,
    so that it is never encoded twice.

    Decoded within the body's limits (`_json.parse_json`): nesting too deep is a 400 naming
    `param`; a string that is not JSON otherwise (or holds a lone surrogate) reaches the
    template as the string it is."""
    if isinstance(arguments, str):
        try:
            decoded = parse_json(arguments, param=param)
        except InvalidRequest as exc:
            if exc.code == TOO_DEEP:
                raise
            return arguments
        return decoded if isinstance(decoded, dict) else arguments
    return arguments
