"""The Responses output and event classes, unstructured through the one converter: the JSON
the wire carries, field order included; no server, no model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlx_nursery.engine import GenerationRequest, Usage
from mlx_nursery.generation._converter import structure, to_json
from mlx_nursery.generation._errors import InvalidRequest
from mlx_nursery.generation._generate import Finished
from mlx_nursery.generation._logprobs import LogprobEntry
from mlx_nursery.generation._plan import Prepared
from mlx_nursery.generation._tool_calls import ToolCallOut
from mlx_nursery.openai._chat_endpoint import CHAT
from mlx_nursery.openai._responses import PreparedResponse
from mlx_nursery.openai._responses_events import OutputTextDelta
from mlx_nursery.openai._responses_items import input_items_page
from mlx_nursery.openai._responses_objects import OutputFunctionCall
from mlx_nursery.openai._responses_output import ResponseBuilder
from mlx_nursery.openai._responses_schemas import ResponsesRequest
from tests.http_helpers import validate

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def builder(**fields: Any) -> ResponseBuilder:
    request = structure({"model": "tiny", "input": "hi", **fields}, ResponsesRequest)
    tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
        for t in fields.get("tools", [])
    ]
    prepared = Prepared(CHAT, GenerationRequest([1], 8), (), True, False, "tiny", tools=tools)
    return ResponseBuilder(PreparedResponse(request, prepared, [], [], id="resp_1", created_at=7))


def test_a_text_stream_emits_the_events_in_order_numbered_from_zero() -> None:
    b = builder()
    events = b.opening() + b.text("Hel") + b.text("lo")
    events += b.finish(Finished("stop", Usage(3, 2, 1)))
    events.append(b.final_event())
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(next(iter(e)) == "type" and list(e)[-1] == "sequence_number" for e in events)
    # What went out earlier is a snapshot: the item grew after its `added` event.
    assert events[2]["item"] == {
        "type": "message",
        "id": events[2]["item"]["id"],
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    assert events[6]["text"] == "Hello"
    final = events[-1]["response"]
    validate(final, "Response")
    assert final["status"] == "completed" and final["output"][0]["status"] == "completed"
    assert final["usage"] == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 1, "cache_write_tokens": 2},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5,
    }


def test_unset_top_logprobs_user_and_usage_are_absent_and_set_ones_keep_their_place() -> None:
    bare = builder().response()
    assert not {"top_logprobs", "user", "usage"} & set(bare)
    b = builder(user="u", top_logprobs=2, include=["message.output_text.logprobs"])
    b.finish(Finished("length", Usage(1, 1, 0)))
    keys = list(b.response())
    assert keys[keys.index("top_p") + 1] == "top_logprobs"
    assert keys[-2:] == ["user", "usage"]
    assert b.response()["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_echoed_text_format_leaves_out_its_null_fields() -> None:
    form = {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    assert builder(text={"format": form}).response()["text"] == {
        "format": {"name": "x", "schema": {"type": "object"}, "type": "json_schema"}
    }
    assert builder(text={}).response()["text"] == {"format": {"type": "text"}}


def test_a_function_call_item_and_its_argument_events() -> None:
    b = builder(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    events = b.text("Let me see.") + b.call(
        ToolCallOut(0, "call_1", "get_weather", '{"city": "Paris"}', complete=False)
    )
    kinds = [e["type"] for e in events]
    assert kinds[3:6] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    added, delta, done, item_done = events[6:]
    assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress"
    assert list(added["item"]) == ["type", "id", "call_id", "name", "arguments", "status"]
    assert delta["delta"] == done["arguments"] == '{"city": "Paris"}'
    assert item_done["item"]["status"] == "incomplete"
    response = b.response()
    assert response["tool_choice"] == {"type": "function", "function": None, "name": "get_weather"}
    assert response["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": None,
            "parameters": WEATHER["parameters"],
            "strict": False,
        }
    ]
    assert isinstance(b.output[1], OutputFunctionCall)
    assert b.conversation()[-1]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_logprobs_and_the_error_event() -> None:
    b = builder()
    entry = LogprobEntry("Hi", -0.5, (("Hi", -0.5, b"Hi"),), b"Hi")
    (_, _, delta) = b.text("Hi", (entry,))
    assert delta["logprobs"] == [
        {
            "token": "Hi",
            "logprob": -0.5,
            "bytes": [72, 105],
            "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}],
        }
    ]
    error = b.error_event(InvalidRequest("bad", param="x", code="invalid_value"))
    assert error == {
        "type": "error",
        "code": "invalid_value",
        "message": "bad",
        "param": "x",
        "sequence_number": 3,
    }
    assert b.status == "failed"


def test_an_event_class_unstructures_to_its_wire_json() -> None:
    event = OutputTextDelta(
        item_id="msg_1", output_index=0, content_index=0, delta="x", logprobs=[], sequence_number=9
    )
    assert json.dumps(to_json(event), separators=(",", ":")) == (
        '{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,'
        '"content_index":0,"delta":"x","logprobs":[],"sequence_number":9}'
    )


def test_input_items_pages() -> None:
    items = [{"id": f"msg_{i}", "type": "message"} for i in range(3)]
    page = input_items_page(items, after="msg_2", limit=1, order="desc")
    assert page == {
        "object": "list",
        "data": [items[1]],
        "first_id": "msg_1",
        "last_id": "msg_1",
        "has_more": True,
    }
    assert list(page) == ["object", "data", "first_id", "last_id", "has_more"]
    empty = input_items_page(items, after="msg_0", limit=5, order="desc")
    assert empty["data"] == [] and empty["first_id"] is None and not empty["has_more"]
    with pytest.raises(InvalidRequest):
        input_items_page(items, after="nope", limit=5, order="asc")
