"""The OpenAI layer's request schemas through the one converter: the Responses input items as
a tagged union on `type`, typed tools / tool_choice / formats, and the 400s they give (the
parameter's path and code). HTTP tests: input that typing now refuses, and that it still takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_nursery.generation._converter import structure
from mlx_nursery.generation._errors import InvalidRequest
from mlx_nursery.generation._request_parts import (
    FunctionTool,
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedToolChoice,
    TextJsonSchemaFormat,
)
from mlx_nursery.openai._chat import ChatCompletionRequest
from mlx_nursery.openai._responses_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    ReasoningText,
    ResponsesRequest,
    TextPart,
)
from tests.http_helpers import chat_body, running_server, validate_error


def items(*raw: Any) -> list[Any]:
    request = structure({"model": "m", "input": list(raw)}, ResponsesRequest)
    assert isinstance(request.input, list)
    return request.input


def refused(body: dict[str, Any], cls: type = ResponsesRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        structure({"model": "m", **body}, cls)
    assert caught.value.status == 400
    return caught.value


# -- the tagged union ---------------------------------------------------------------------------
def test_each_item_type_structures_to_its_class() -> None:
    message, call, output, reasoning = items(
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok", "id": "fco_1"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
    )
    assert message == MessageItem(role="assistant", content=[TextPart("output_text", "a")])
    assert call == FunctionCallItem(call_id="c1", name="f", arguments="{}")
    assert output == FunctionCallOutputItem(call_id="c1", output="ok", id="fco_1")
    assert reasoning == ReasoningItem(summary=[ReasoningText("hm", "summary_text")])


def test_a_missing_type_is_a_message() -> None:
    (item,) = items({"role": "user", "content": "hi"})
    assert item == MessageItem(role="user", content="hi")


def test_replayed_output_fields_are_ignored_on_items() -> None:
    (item,) = items(
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "a", "annotations": [], "logprobs": []}],
        }
    )
    assert item == MessageItem(role="assistant", content=[TextPart("output_text", "a")], id="msg_1")


@pytest.mark.parametrize(
    ("item", "param", "code"),
    [
        ({"type": "input_image"}, "input[0].type", "unsupported_parameter"),
        ({"type": 5}, "input[0].type", "unsupported_parameter"),
        ({"type": None}, "input[0].type", "unsupported_parameter"),
        (7, "input[0]", "invalid_value"),
        ({"role": "wizard", "content": "x"}, "input[0].role", "invalid_value"),
        ({"role": "user"}, "input[0].content", "missing_required_parameter"),
        ({"role": "user", "content": 5}, "input[0].content", "invalid_value"),
        (
            {"role": "user", "content": [{"type": "input_file", "file_id": "x"}]},
            "input[0].content[0].type",
            "unsupported_content",
        ),
        (
            {"role": "user", "content": [{"type": "input_text", "text": 5}]},
            "input[0].content[0].text",
            "invalid_value",
        ),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}},
            "input[0].arguments",
            "invalid_value",
        ),
        (
            {"type": "function_call_output", "output": "x"},
            "input[0].call_id",
            "missing_required_parameter",
        ),
        ({"type": "reasoning", "summary": "thinking"}, "input[0].summary", "invalid_value"),
        ({"type": "reasoning", "summary": [1]}, "input[0].summary[0]", "invalid_value"),
        (
            {"type": "reasoning", "summary": [{"type": "summary_text"}]},
            "input[0].summary[0].text",
            "missing_required_parameter",
        ),
        ({"role": "user", "content": "x", "id": ["x"]}, "input[0].id", "invalid_value"),
    ],
)
def test_a_bad_item_is_a_400_naming_its_path(item: Any, param: str, code: str) -> None:
    error = refused({"input": [{"role": "user", "content": "first"}, item]})
    assert (error.param, error.code) == (param.replace("input[0]", "input[1]"), code)


def test_an_unknown_type_is_quoted_short() -> None:
    error = refused({"input": [{"type": "u" * 10_000}]})
    assert "…" in error.message and len(error.message) < 200


# -- tools, tool_choice, formats --------------------------------------------------------------
def test_tools_take_both_forms() -> None:
    nested = {"type": "function", "function": {"name": "f", "strict": True}}
    flat = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    request = structure({"model": "m", "input": "x", "tools": [nested, flat]}, ResponsesRequest)
    assert request.tools is not None
    assert [t.spec.name for t in request.tools] == ["f", "f"]
    assert isinstance(request.tools[1], FunctionTool) and request.tools[1].function is None


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_parameter"),
        ({"tools": ["f"]}, "tools[0]", "invalid_value"),
        (
            {"tools": [{"type": "function", "function": {"name": ["f"]}}]},
            "tools[0].function.name",
            "invalid_value",
        ),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": "{}"}]},
            "tools[0].parameters",
            "invalid_value",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "paramters": {}}}]},
            "tools[0].function.paramters",
            "unknown_parameter",
        ),
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", "invalid_value"),
        ({"tool_choice": {"type": "function", "function": "f"}}, "tool_choice.function", None),
        ({"response_format": "json"}, "response_format", "invalid_value"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "unsupported_parameter"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
            "missing_required_parameter",
        ),
        (
            {"response_format": {"type": "json_object", "schema": {}}},
            "response_format.schema",
            "unknown_parameter",
        ),
    ],
)
def test_a_bad_chat_tool_or_format_is_a_400_naming_its_path(
    body: dict[str, Any], param: str, code: str | None
) -> None:
    error = refused({"messages": [], **body}, ChatCompletionRequest)
    assert error.param == param
    if code is not None:
        assert error.code == code


def test_typed_choices_and_formats() -> None:
    request = structure(
        {
            "model": "m",
            "messages": [],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        },
        ChatCompletionRequest,
    )
    assert isinstance(request.tool_choice, NamedToolChoice)
    assert request.tool_choice.function is not None and request.tool_choice.function.name == "f"
    assert isinstance(request.response_format, JsonSchemaFormat)
    responses = structure(
        {
            "model": "m",
            "input": "x",
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
        },
        ResponsesRequest,
    )
    assert isinstance(responses.tool_choice, NamedToolChoice) and responses.tool_choice.name == "f"
    assert responses.text is not None
    assert responses.text.format == TextJsonSchemaFormat(name="x", schema={})
    plain = structure(
        {"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}, ResponsesRequest
    )
    assert plain.text is not None and plain.text.format == JsonObjectFormat()


@pytest.mark.parametrize(
    ("text", "param", "code"),
    [
        ({"format": {"type": "json_schema", "name": [1], "schema": {}}}, "text.format.name", None),
        ({"format": {"type": "json_schema", "name": "x"}}, "text.format.schema", None),
        ({"format": {"type": "json_object", "name": "x"}}, "text.format.name", "unknown_parameter"),
        ({"format": {"type": "xml"}}, "text.format.type", "unsupported_parameter"),
        ({"format": "json"}, "text.format", "invalid_value"),
        ({"tone": "dry"}, "text.tone", "unknown_parameter"),
    ],
)
def test_a_bad_text_format_is_a_400_naming_its_path(
    text: dict[str, Any], param: str, code: str | None
) -> None:
    error = refused({"input": "x", "text": text})
    assert error.param == param
    if code is not None:
        assert error.code == code


# -- through the server -------------------------------------------------------------------------
NEWLY_REFUSED: list[tuple[str, dict[str, Any], str, str | None]] = [
    # Unknown fields inside tools and formats were ignored before they were typed: a typo
    # (`paramters`) silently dropped the schema the client meant.
    (
        "/v1/chat/completions",
        chat_body(tools=[{"type": "function", "function": {"name": "f", "paramters": {}}}]),
        "tools[0].function.paramters",
        "unknown_parameter",
    ),
    (
        "/v1/chat/completions",
        chat_body(response_format={"type": "json_object", "strict": True}),
        "response_format.strict",
        "unknown_parameter",
    ),
    (
        "/v1/chat/completions",
        chat_body(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {}, "strcit": True},
            }
        ),
        "response_format.json_schema.strcit",
        "unknown_parameter",
    ),
    (
        "/v1/chat/completions",
        chat_body(tools=[{"type": "function", "function": {"name": "f", "strict": "yes"}}]),
        "tools[0].function.strict",
        "invalid_value",
    ),
    (
        "/v1/responses",
        {"model": "tiny", "input": "x", "tools": [{"type": "function", "name": "f", "x": 1}]},
        "tools[0].x",
        "unknown_parameter",
    ),
    (
        "/v1/responses",
        {
            "model": "tiny",
            "input": "x",
            "stream": True,
            "stream_options": {"include_obfuscation": 1},
        },
        "stream_options.include_obfuscation",
        None,  # a wrong type outside the fields once checked by hand carries no code
    ),
]


async def test_typed_fields_refuse_what_was_silently_accepted(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        for path, body, param, code in NEWLY_REFUSED:
            response = await http.post(path, json=body)
            assert response.status_code == 400, (body, response.text)
            validate_error(response.json())
            error = response.json()["error"]
            assert (error["param"], error["code"]) == (param, code), error
        # Still served: both tool forms at once, replayed output items, a null tool_choice.
        ok = await http.post(
            "/v1/responses",
            json={
                "model": "tiny",
                "input": [
                    {"role": "user", "content": "hi"},
                    {
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": "a", "annotations": []}],
                    },
                ],
                "tools": [{"type": "function", "function": {"name": "f"}, "name": "f"}],
                "tool_choice": None,
                "max_output_tokens": 2,
            },
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["tool_choice"] == "auto" and ok.json()["text"] == {
            "format": {"type": "text"}
        }


def test_a_null_for_a_field_with_a_default_is_that_default() -> None:
    """Clients that send every field send the unset ones as null: a field whose type has no
    null of its own takes its default then (embeddings' encoding_format, speech's speed)."""
    from mlx_nursery.openai._embeddings import EmbeddingsRequest
    from mlx_nursery.openai._speech import SpeechBody

    speech = structure(
        {"model": "m", "input": "x", "voice": "v", "speed": None, "stream_format": None},
        SpeechBody,
    )
    assert (speech.speed, speech.stream_format) == (1.0, "audio")
    embeddings = structure({"model": "m", "input": "x", "encoding_format": None}, EmbeddingsRequest)
    assert embeddings.encoding_format == "float"
    # A field without a default keeps null a 400 naming it.
    assert refused({"input": "x", "voice": None}, SpeechBody).param == "voice"
