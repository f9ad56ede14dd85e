"""ToolCallExtractor: pure logic, with mlx-lm's json_tools parser, fed a piece at a time."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.tool_parsers import json_tools

from mlx_nursery.generation._tool_calls import ContentText, ToolCallExtractor, ToolCallOut
from mlx_nursery.generation._tools import ToolFormat, normalize_tools

JSON_FORMAT = ToolFormat(
    json_tools.tool_call_start,
    json_tools.tool_call_end,
    json_tools.parse_tool_call,
    native=True,
    json=True,
)
DECLARED = normalize_tools(
    [{"type": "function", "function": {"name": name}} for name in ("f", "g", "get_weather")]
)


def extractor(parallel: bool = True, form: ToolFormat = JSON_FORMAT) -> ToolCallExtractor:
    return ToolCallExtractor(form, DECLARED, max_calls=None if parallel else 1)


def run(pieces: list[str], parallel: bool = True, *, cut: bool = False) -> list[object]:
    x = extractor(parallel)
    out = [p for piece in pieces for p in x.feed(piece)] + x.finish(cut=cut)
    return out


def content(out: list[object]) -> str:
    return "".join(o.text for o in out if isinstance(o, ContentText))


def calls(out: list[object]) -> list[tuple[str, object]]:
    return [(o.name, json.loads(o.arguments)) for o in out if isinstance(o, ToolCallOut)]


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


CALL_F = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
CALL_G = '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
NOT_CALLS = [
    "<tool_call>not json</tool_call>ok",  # a body that does not parse
    'x<tool_call>{"name": "f"',  # left open at the end
    '<tool_call>{"name": "f", "arguments": {}}',  # left open, though it parses: see below
    f"<tool_call>\n{CALL_F}\n</tool_call>",  # nested
    '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # a tool not declared
    "<tool_call>[]</tool_call>",  # parses, but to no call
    '<tool_call>{"arguments": {}}</tool_call> no name',
    '<tool_call>{"name": {"x": 1}}</tool_call>',  # a name that is not a string
    "Use the <tool_call> tag to call a tool, and </tool_call> to end it.",
    "Wrap it as <tool_call>...",
]


@pytest.mark.parametrize("text", NOT_CALLS[:2] + NOT_CALLS[3:])
def test_markup_that_is_not_a_call_comes_back_as_content_verbatim(text: str) -> None:
    for pieces in ([text], list(text)):  # whole, and a character at a time
        out = run(pieces)
        assert content(out) == text and not calls(out)


def test_a_call_left_open_at_the_end_is_a_call_when_its_body_parses() -> None:
    """As vLLM's Hermes parser reads it: a model that ends with its call, end markup left out."""
    assert calls(run([NOT_CALLS[2]])) == [("f", {})]


def test_prose_that_mentions_the_markup_streams_on() -> None:
    x = extractor()
    assert content(x.feed("Use the <tool_call> tag")) == "Use the <tool_call> tag"
    assert content(x.feed(" to call a tool. ")) == " to call a tool. "
    (call,) = x.feed(CALL_F)
    assert isinstance(call, ToolCallOut) and call.name == "f"
    assert x.finish() == []


def test_an_undeclared_tool_in_a_list_makes_the_whole_span_content() -> None:
    text = '<tool_call>[{"name": "f", "arguments": {}}, {"name": "h", "arguments": {}}]</tool_call>'
    assert run([text]) == [ContentText(text)]
    assert calls(run([text.replace('"h"', '"g"')])) == [("f", {}), ("g", {})]


def test_whitespace_only_content_around_calls_is_dropped() -> None:
    for pieces in ([f"\n{CALL_F}\n{CALL_G}\n"], list(f"\n{CALL_F}\n \n{CALL_G}\n")):
        out = run(pieces)
        assert content(out) == "" and calls(out) == [("f", {"a": 1}), ("g", {})]
    out = run(list(f"Checking.\n{CALL_F}\n{CALL_G}\n\nDone.\n"))
    assert content(out) == "Checking.\n\n\nDone.\n"  # text keeps its own whitespace
    assert run([" \n"]) == [ContentText(" \n")]  # no call: a reply of whitespace, as written


def test_whitespace_before_markup_that_is_not_a_call_is_kept() -> None:
    text = f"{CALL_F}\n<tool_call>oops</tool_call>"
    out = run(list(text))
    assert calls(out) == [("f", {"a": 1})]
    assert content(out) == "\n<tool_call>oops</tool_call>"


def test_a_format_without_end_markup_runs_its_call_to_the_end() -> None:
    from mlx_lm.tool_parsers import mistral

    form = ToolFormat(
        mistral.tool_call_start, mistral.tool_call_end, mistral.parse_tool_call, True, False
    )
    x = extractor(form=form)
    out = x.feed('Sure.[TOOL_CALLS]f[ARGS]{"a": 1}') + x.finish()
    assert content(out) == "Sure." and calls(out) == [("f", {"a": 1})]


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


@pytest.mark.parametrize("tail", ["\n</", "\n</tool_c", "</"])
def test_a_whole_call_cut_in_its_end_markup_keeps_none_of_it(tail: str) -> None:
    x = extractor()
    x.feed('<tool_call>\n{"name": "f", "arguments": {"a": 1}}' + tail)
    (call,) = x.finish(cut=True)
    assert isinstance(call, ToolCallOut) and json.loads(call.arguments) == {"a": 1}


def test_arguments_written_whole_before_a_malformed_wrapper_are_those_arguments() -> None:
    x = extractor()
    x.feed('<tool_call>\n{"name": "f", "arguments": {"a": [1, "}"]}}}\n<')
    (call,) = x.finish(cut=True)
    assert isinstance(call, ToolCallOut) and not call.complete
    assert json.loads(call.arguments) == {"a": [1, "}"]}


def test_a_call_of_an_undeclared_tool_cut_is_content() -> None:
    text = '<tool_call>\n{"name": "h", "arguments": {"a'
    assert run([text], cut=True) == [ContentText(text)]


@pytest.mark.parametrize("tail", ['<tool_call>\n{"na', "<tool_call>", "<tool_"])
def test_markup_cut_before_a_name_is_dropped_not_shown(tail: str) -> None:
    """Cut by the budget, start markup that can no longer make a call is not the reply's
    text; ended by the model (not cut), it is, as written."""
    assert run(["Sure. " + tail], cut=True) == [ContentText("Sure. ")]
    assert content(run(["Sure. " + tail], cut=False)) == "Sure. " + tail
    assert content(run(["a <"], cut=True)) == "a <"  # one character: kept


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "\n",
    " ",
    "hi",
    "<",
    "{",
    "[",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "h", "arguments": {}}',
    "[TOOL_CALLS]",
]


def outline(out: list[object]) -> list[object]:
    """Content merged and calls as (name, arguments): what a client sees, ids aside."""
    seen: list[object] = []
    for o in out:
        if isinstance(o, ContentText):
            if seen and isinstance(seen[-1], str):
                seen[-1] += o.text
            else:
                seen.append(o.text)
        elif isinstance(o, ToolCallOut):
            seen.append((o.name, o.arguments, o.complete))
    return seen


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12), st.data(), st.booleans())
def test_any_text_splits_the_same_way_and_without_calls_is_content_whole(
    fragments: list[str], data: st.DataObject, cut: bool
) -> None:
    text = "".join(fragments)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    whole, split = run([text], cut=cut), run(pieces, cut=cut)
    assert outline(whole) == outline(split)
    if not any(isinstance(o, ToolCallOut) for o in whole):
        shown = content(whole)
        assert text.startswith(shown)
        dropped = text[len(shown) :]
        # Only cut, only markup that could no longer make a call (an open call, or start
        # markup cut partway) is dropped.
        assert not dropped or (cut and JSON_FORMAT.start.startswith(dropped[:2])), dropped
