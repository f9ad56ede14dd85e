"""Tool calling through the real server: a forced token script makes the random model emit calls.

The script only dictates which token comes next; the real tokenizer, engine, detokenizer,
tool-call extraction and SSE path all run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from mlx_nursery.generation._converter import structure
from mlx_nursery.generation._prompts import render_chat
from mlx_nursery.generation._request_parts import ChatMessage
from mlx_nursery.testing import LiveServer, start_server
from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    hosted_of,
    running_server,
    scripted,
    sdk,
    server_thread,
    sse_events,
    validate,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}

ONE_CALL = (
    "Let me check."
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    'and<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call> Done.'
)
SCRIPTS = {"one": ONE_CALL, "two": TWO_CALLS}
CUT_AT = ONE_CALL.index('"Paris"')  # the script stops being long enough: max_tokens cuts the call


def tool_request(user: str, **fields: Any) -> dict[str, Any]:
    fields = {"max_tokens": 80, "temperature": 0, **fields}
    return chat_body("What is the weather in Paris?", user=user, tools=[WEATHER, TIME], **fields)


@pytest.fixture(scope="module")
def scripted_users(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model, its output dictated for the users `SCRIPTS` names."""
    with server_thread(tiny_model, extra_processors=scripted(SCRIPTS, tiny_model)) as served:
        yield served


async def test_non_streaming_tool_call(scripted_users: ThreadedServer) -> None:
    async with (
        borrowed(scripted_users) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        reply = (await http.post("/v1/chat/completions", json=tool_request("one"))).json()
    validate(reply, "CreateChatCompletionResponse")
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


async def test_streaming_parallel_tool_calls_with_the_sdk_helper(
    scripted_users: ThreadedServer,
) -> None:
    async with borrowed(scripted_users) as server:
        client = sdk(server)
        body = tool_request("two")
        async with client.chat.completions.stream(**body) as stream:
            chunks = []
            async for event in stream:
                if event.type == "chunk":
                    chunks.append(event.chunk)
            final = await stream.get_final_completion()
    for chunk in chunks:
        validate(chunk.model_dump(exclude_unset=True), "CreateChatCompletionStreamResponse")
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "and Done."  # text between and after calls streams; markup never does
    assert "<" not in content and "tool_call" not in content
    fragments = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    firsts = [f for f in fragments if f.id]
    assert [f.index for f in firsts] == [0, 1]
    assert [f.function.name for f in firsts] == ["get_weather", "get_time"]
    assert all(f.type == "function" for f in firsts)
    for index, expected in [(0, {"city": "Paris"}), (1, {"zone": "CET"})]:
        arguments = "".join(f.function.arguments or "" for f in fragments if f.index == index)
        assert json.loads(arguments) == expected
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in message.tool_calls] == ["get_weather", "get_time"]


async def test_parallel_tool_calls_false_stops_after_the_first_call(
    scripted_users: ThreadedServer,
) -> None:
    async with (
        borrowed(scripted_users) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        reply = (
            await http.post(
                "/v1/chat/completions", json=tool_request("two", parallel_tool_calls=False)
            )
        ).json()
        whole = (await http.post("/v1/chat/completions", json=tool_request("two"))).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]
    assert reply["usage"]["completion_tokens"] < whole["usage"]["completion_tokens"]


async def test_tool_choice_none_offers_no_tools_and_parses_nothing(
    scripted_users: ThreadedServer,
) -> None:
    async with (
        borrowed(scripted_users) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        offered = (await http.post("/v1/chat/completions", json=tool_request("one"))).json()
        body = tool_request(
            "one", tool_choice="none", stream=True, stream_options={"include_usage": True}
        )
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            events = (await sse_events(response))[:-1]
    # Not offered: the tool definitions are not in the prompt.
    assert offered["usage"]["prompt_tokens"] > events[-1]["usage"]["prompt_tokens"] + 50
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == ONE_CALL  # and not parsed: the markup is just text
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_tool_round_trip_renders_history_once_encoded(scripted_users: ThreadedServer) -> None:
    async with borrowed(scripted_users) as server:
        client = sdk(server)
        first = await client.chat.completions.create(**tool_request("one"))
        call = first.choices[0].message.tool_calls[0]
        history = [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": first.choices[0].message.content,
                "tool_calls": [call.model_dump()],
            },
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21}'},
        ]
        second = await client.chat.completions.create(
            model="tiny", messages=history, tools=[WEATHER], max_tokens=4, temperature=0
        )
        tokenizer = hosted_of(server).served.tokenizer
    messages = [structure(m, ChatMessage) for m in json.loads(json.dumps(history, default=str))]
    expected = render_chat(tokenizer, messages, [WEATHER])
    assert second.usage.prompt_tokens == len(expected)
    prompt = tokenizer.decode(expected)
    assert prompt.count('"arguments": {"city": "Paris"}') == 1
    assert '\\"city\\"' not in prompt  # never JSON-encoded twice
    assert '<tool_response>\n{"temperature_c": 21}\n</tool_response>' in prompt


async def test_a_call_cut_off_by_max_tokens_is_returned_partial(
    tiny_model: Path, scripted_users: ThreadedServer
) -> None:
    """As OpenAI does: the call with the arguments generated so far and finish_reason length
    (chat), a function_call item with status incomplete (Responses), streaming and not."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    budget = len(tokenizer.encode(ONE_CALL[: CUT_AT + 3], add_special_tokens=False))
    async with borrowed(scripted_users) as server:
        client = sdk(server)
        reply = await client.chat.completions.create(**tool_request("one", max_tokens=budget))
        chunks = [
            c
            async for c in await client.chat.completions.create(
                **tool_request("one", max_tokens=budget), stream=True
            )
        ]
        responses_request = {
            "model": "tiny",
            "input": "weather?",
            "user": "one",
            "temperature": 0,
            "max_output_tokens": budget,
            "tools": [{"type": "function", **WEATHER["function"]}],
        }
        response = await client.responses.create(**responses_request)
        async with client.responses.stream(**responses_request) as stream:
            # The SDK's get_final_response() wants response.completed; this one is incomplete.
            incomplete = [e async for e in stream if e.type == "response.incomplete"]
            streamed = incomplete[0].response
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert call.function.arguments.startswith(
        '{"city": "Pa'
    ) and not call.function.arguments.endswith("}")
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    for result in (response, streamed):
        assert result.status == "incomplete"
        assert result.incomplete_details is not None
        assert result.incomplete_details.reason == "max_output_tokens"
        items = [item for item in result.output if item.type == "function_call"]
        assert [(i.name, i.status) for i in items] == [("get_weather", "incomplete")]
        assert items[0].arguments == call.function.arguments


async def test_a_stop_string_inside_a_call_cuts_it_as_the_budget_does(
    scripted_users: ThreadedServer,
) -> None:
    """The call's markup never becomes the reply's text: a stop string matched inside the
    call ends it incomplete (finish_reason stop, the arguments so far), and one matched before
    its name drops the markup."""
    async with borrowed(scripted_users) as server:
        client = sdk(server)
        inside = await client.chat.completions.create(**tool_request("one", stop=['"Paris"']))
        before = await client.chat.completions.create(**tool_request("one", stop=['"name"']))
    choice = inside.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("stop", "Let me check.")
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert call.function.arguments.startswith('{"city":') and "Paris" not in call.function.arguments
    assert before.choices[0].message.content == "Let me check."
    assert not before.choices[0].message.tool_calls


async def test_a_truncated_message_item_is_incomplete_as_its_response(tiny_model: Path) -> None:
    async with running_server(tiny_model) as server:
        client = sdk(server)
        cut = await client.responses.create(
            model="tiny", input="Tell a tale.", max_output_tokens=4, temperature=0
        )
        # At temperature 0 the tiny model writes no end: this one is cut as well (at 400
        # tokens as at 40), and its message item must say so as its response does.
        whole = await client.responses.create(
            model="tiny", input="Tell a tale.", max_output_tokens=40, temperature=0
        )
    validate(cut.model_dump(exclude_unset=True, mode="json", warnings=False), "Response")
    assert (cut.status, cut.output[0].status) == ("incomplete", "incomplete")
    assert whole.status == whole.output[0].status


# -- the model's text is never lost: markup that is not a call comes back as text -------------
# The scripted model (one server for these tests) writes each text exactly; every API reads it
# back through the real extraction, streamed and not.
NOT_A_CALL = {
    "bad json": 'Let me try.<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n'
    "</tool_call>",
    "left open": 'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city"',
    "nested": '<tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
    "</tool_call>",
    "prose": "Use the <tool_call> tag to call a tool, then wait.",
    "undeclared": '<tool_call>\n{"name": "delete_files", "arguments": {}}\n</tool_call>',
}
ONLY_CALLS = (
    '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>\n'
)
APIS = ["chat", "responses", "messages"]


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[LiveServer]:
    with start_server(model="scripted") as server:
        yield server


@attrs.frozen
class Turn:
    """What one API answered, in common terms."""

    text: str | None
    """The content (None: chat's null content, or no message / text block at all)."""
    calls: list[tuple[str, Any]]
    finish: str


async def a_turn(server: LiveServer, api: str, stream: bool, text: str) -> Turn:
    script = {"script": {"output": {"text": text}}}
    if api == "chat":
        return await _chat_turn(server, stream, script)
    if api == "responses":
        return await _responses_turn(server, stream, script)
    return await _messages_turn(server, stream, script)


async def _chat_turn(server: LiveServer, stream: bool, script: dict[str, Any]) -> Turn:
    async with server.async_client() as client:
        fields: dict[str, Any] = {
            "model": server.model,
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [WEATHER, TIME],
            "extra_body": script,
        }
        if not stream:
            choice = (await client.chat.completions.create(**fields)).choices[0]
            calls = choice.message.tool_calls or []
            found = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
            return Turn(choice.message.content, found, choice.finish_reason)
        chunks = [c async for c in await client.chat.completions.create(**fields, stream=True)]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    text = "".join(d.content or "" for d in deltas)
    fragments = [f for d in deltas for f in d.tool_calls or []]
    names = [f.function.name for f in fragments if f.id]
    arguments = [
        "".join(f.function.arguments or "" for f in fragments if f.index == i)
        for i in range(len(names))
    ]
    found = [(name, json.loads(a)) for name, a in zip(names, arguments, strict=True)]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    return Turn(text or None, found, finish)


async def _responses_turn(server: LiveServer, stream: bool, script: dict[str, Any]) -> Turn:
    async with server.async_client() as client:
        fields: dict[str, Any] = {
            "model": server.model,
            "input": "weather?",
            "tools": [{"type": "function", **t["function"]} for t in (WEATHER, TIME)],
            "store": False,
            "extra_body": script,
        }
        if stream:
            events = [e async for e in await client.responses.create(**fields, stream=True)]
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            response = events[-1].response
            assert deltas == response.output_text  # what streamed is what the response holds
        else:
            response = await client.responses.create(**fields)
    messages = [item for item in response.output if item.type == "message"]
    assert len(messages) <= 1
    calls = [item for item in response.output if item.type == "function_call"]
    found = [(c.name, json.loads(c.arguments)) for c in calls]
    text = messages[0].content[0].text if messages else None
    return Turn(text, found, response.status)


async def _messages_turn(server: LiveServer, stream: bool, script: dict[str, Any]) -> Turn:
    import anthropic

    async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="unused") as client:
        fields: dict[str, Any] = {
            "model": server.model,
            "max_tokens": 200,
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [
                {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                for t in (WEATHER, TIME)
            ],
            "extra_body": script,
        }
        if stream:
            async with client.messages.stream(**fields) as events:
                deltas = "".join([e.text async for e in events if e.type == "text"])
                message = await events.get_final_message()
            assert deltas == "".join(b.text for b in message.content if b.type == "text")
        else:
            message = await client.messages.create(**fields)
    texts = [block.text for block in message.content if block.type == "text"]
    assert len(texts) <= 1
    found = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    return Turn(texts[0] if texts else None, found, str(message.stop_reason))


DONE_WITHOUT_CALLS = {"chat": "stop", "responses": "completed", "messages": "end_turn"}
DONE_WITH_CALLS = {"chat": "tool_calls", "responses": "completed", "messages": "tool_use"}


@pytest.mark.parametrize("case", list(NOT_A_CALL))
@pytest.mark.parametrize("api", APIS)
async def test_markup_that_is_not_a_call_comes_back_as_text(
    scripted_server: LiveServer, api: str, case: str
) -> None:
    """Bad JSON, a call left open at the end, nested markup, prose that mentions the tag, a
    tool the request did not declare: the model's text, markup included, is the content
    (a Responses message, a Messages text block), streamed or not, and no call is made."""
    text = NOT_A_CALL[case]
    for stream in (False, True):
        turn = await a_turn(scripted_server, api, stream, text)
        assert turn == Turn(text, [], DONE_WITHOUT_CALLS[api]), stream


@pytest.mark.parametrize("api", APIS)
async def test_whitespace_between_calls_is_not_content(
    scripted_server: LiveServer, api: str
) -> None:
    expected = [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    for stream in (False, True):
        turn = await a_turn(scripted_server, api, stream, ONLY_CALLS)
        assert turn == Turn(None, expected, DONE_WITH_CALLS[api]), stream
