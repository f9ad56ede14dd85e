"""The Messages API's pure logic: blocks to the chat template's messages, a stream's events
block by block, stop reasons and usage. (The real server and SDK: test_http_anthropic.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from mlx_nursery.anthropic import MessageEvents, parse_messages_request
from mlx_nursery.anthropic._conversation import template_messages
from mlx_nursery.anthropic._output import stop_reason, usage_json
from mlx_nursery.anthropic._prepare import MESSAGES_WIRE
from mlx_nursery.engine import GenerationRequest, Usage
from mlx_nursery.generation import (
    Admitted,
    Finished,
    ImageLimits,
    ImageTaker,
    InvalidRequest,
    Prepared,
    TextDelta,
    ToolCallOut,
)


def rendered(messages: list[dict[str, Any]], **fields: Any) -> tuple[list[dict[str, Any]], bool]:
    request = parse_messages_request(
        {"model": "m", "max_tokens": 4, "messages": messages, **fields}
    )
    return template_messages(request, ImageTaker(None, ImageLimits(), "url"))


def test_tool_use_and_results_become_calls_and_tool_messages_in_place() -> None:
    messages, prefill = rendered(
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "P"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "down"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "And "},
                    {"type": "text", "text": "tomorrow?"},
                ],
            },
        ],
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
    )
    assert not prefill
    assert messages == [
        {"role": "system", "content": "Be brief.\n\nBe kind."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "w", "arguments": {"city": "P"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: down"},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_a_last_assistant_message_is_a_prefill() -> None:
    _, prefill = rendered(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    )
    assert prefill


@pytest.mark.parametrize(
    "messages, param",
    [
        ([], "messages"),
        ([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}],
         "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "n", "input": {}}]}],
         "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "thinking", "thinking": "", "signature": ""}]}],
         "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "text", "text": "x", "citations": [{}]}]}],
         "messages[0].content[0].citations"),
        ([{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}],
         "messages[0].content[0].source.type"),
    ],
)  # fmt: skip
def test_blocks_out_of_place_are_400s_naming_them(messages: list[Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        rendered(messages)
    assert refused.value.param == param


def prepared() -> Prepared:
    request = GenerationRequest([1, 2, 3], 8)
    return Prepared(MESSAGES_WIRE, request, (), True, False, "m", id="msg_x")


def test_a_streams_events_open_and_close_each_block() -> None:
    events = MessageEvents(prepared())
    opening = events.opening(Admitted(Usage(3, 0, 2)))
    assert [e["type"] for e in opening] == ["message_start", "ping"]
    usage = opening[0]["message"]["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (1, 2)
    out = events.text(TextDelta("Hi")) + events.text(TextDelta("")) + events.text(TextDelta("!"))
    out += events.call(ToolCallOut(0, "call_abc", "w", '{"city": "P"}'))
    out += events.text(TextDelta("after"))
    out += events.finish(Finished("tool_calls", Usage(3, 9, 2)))
    assert [(e["type"], e.get("index")) for e in out] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert out[4]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_abc",
        "name": "w",
        "input": {},
    }
    assert out[5]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "P"}'}
    assert out[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert out[-2]["usage"] == {
        "input_tokens": 1,
        "output_tokens": 9,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2,
    }


def test_stop_reasons() -> None:
    usage = Usage(1, 1, 0)
    assert stop_reason(Finished("stop", usage)) == "end_turn"
    assert stop_reason(Finished("stop", usage, stop_sequence="END")) == "stop_sequence"
    assert stop_reason(Finished("length", usage)) == "max_tokens"
    assert stop_reason(Finished("tool_calls", usage)) == "tool_use"
    assert usage_json(Usage(5, 2, 5))["input_tokens"] == 0
