"""ToolCallExtractor: pure logic, with mlx-lm's json_tools parser, fed a piece at a time."""

from __future__ import annotations

import json

from mlx_lm.tool_parsers import json_tools

from mlx_nursery.openai._tools import ContentText, ToolCallExtractor, ToolCallOut, normalize_tools


def extractor(parallel: bool = True) -> ToolCallExtractor:
    return ToolCallExtractor(
        json_tools.tool_call_start,
        json_tools.tool_call_end,
        json_tools.parse_tool_call,
        [],
        max_calls=None if parallel else 1,
    )


def run(pieces: list[str], parallel: bool = True) -> list[object]:
    x = extractor(parallel)
    out = [p for piece in pieces for p in x.feed(piece)] + x.finish()
    return out


def test_markup_split_across_pieces_is_held_back_and_never_emitted() -> None:
    x = extractor()
    assert x.feed("Hi <tool") == [ContentText("Hi ")]
    assert x.feed('_call>{"name": "f", "arguments": {"a": 1}}</tool_') == []
    (call,) = x.feed("call>")
    assert isinstance(call, ToolCallOut) and call.name == "f" and call.index == 0
    assert json.loads(call.arguments) == {"a": 1}
    assert x.feed(" bye") == [ContentText(" bye")]


def test_a_lone_angle_bracket_is_released_once_it_cannot_be_markup() -> None:
    assert run(["a <", "b"]) == [ContentText("a "), ContentText("<b")]


def test_unterminated_and_malformed_calls_are_dropped() -> None:
    assert run(['x<tool_call>{"name": "f"']) == [ContentText("x")]
    assert run(["<tool_call>not json</tool_call>ok"]) == [ContentText("ok")]


def test_parallel_false_keeps_only_the_first_call() -> None:
    text = (
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    out = run([text], parallel=False)
    assert [o.name for o in out if isinstance(o, ToolCallOut)] == ["f"]


def test_tools_in_both_wire_forms_normalize_to_the_nested_form() -> None:
    nested = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    flat = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    assert normalize_tools([nested]) == normalize_tools([flat]) == [nested]


def test_a_call_cut_off_by_the_budget_comes_back_partial() -> None:
    x = extractor()
    assert x.feed('ok<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa') == [
        ContentText("ok")
    ]
    (call,) = x.finish(cut=True)
    assert isinstance(call, ToolCallOut) and not call.complete
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Pa')


def test_a_whole_call_missing_only_its_end_markup_is_complete() -> None:
    x = extractor()
    x.feed('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n')
    (call,) = x.finish(cut=True)
    assert (
        isinstance(call, ToolCallOut) and call.complete and json.loads(call.arguments) == {"a": 1}
    )


def test_a_call_cut_before_its_name_is_dropped() -> None:
    x = extractor()
    x.feed('<tool_call>\n{"na')
    assert x.finish(cut=True) == []
