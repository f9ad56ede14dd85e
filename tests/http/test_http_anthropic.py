"""The Messages API (`/v1/messages`, `/v1/messages/count_tokens`) through a real server and
the official Anthropic SDK: text, streams and their helpers, tool use, stop sequences,
token counts, errors in Anthropic's envelope, keys, and a disconnect that stops compute.

Where a test needs a chosen output, a forced token script (keyed by `metadata.user_id`)
dictates each next token; the tokenizer, engine, tool-call extraction and SSE path all run.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import pytest
import trio
from PIL import Image

from mlx_nursery.server import Running
from tests.http_helpers import (
    ForcedScript,
    ThreadedServer,
    borrowed,
    engine_of,
    eventually,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
    server_thread,
)

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "input_schema": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["CET", "UTC"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCRIPTS = {
    "call": "Let me check." + CALL,
    "words": "Hello there. Goodbye now.",
    "interleaved": "First." + CALL + " Then the time." + CALL.replace("Paris", "Rome") + " Done.",
}
LONG = 3000  # tokens a request would run to if nothing stopped it
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def by_user(scripts: dict[str, str], model: Path) -> Any:
    """extra_processors: a request whose metadata.user_id names a script emits it, then EOS."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def processors(body: Any) -> tuple[Any, ...]:
        user = (body.get("metadata") or {}).get("user_id") or ""
        text = scripts.get(user)
        if text is None:
            return ()
        return (ForcedScript(tokenizer.encode(text, add_special_tokens=False), eos),)

    return processors


def scripted_ask(user: str, *, max_tokens: int) -> dict[str, Any]:
    """A request for the weather that `SCRIPTS[user]` answers, both tools offered."""
    return {
        "model": "tiny",
        "max_tokens": max_tokens,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "metadata": {"user_id": user},
    }


@asynccontextmanager
async def serving(model: Path, **settings: Any) -> AsyncIterator[tuple[Running, Any]]:
    """A server and an SDK client for it (closed with it)."""
    async with running_server(model, **settings) as server, _client(server, settings) as client:
        yield server, client


@asynccontextmanager
async def lent(shared: ThreadedServer) -> AsyncIterator[tuple[Running, Any]]:
    """A module's server (`borrowed`) and an SDK client for it, closed with the block."""
    async with borrowed(shared) as server, _client(server, {}) as client:
        yield server, client


@asynccontextmanager
async def _client(server: Running, settings: dict[str, Any]) -> AsyncIterator[Any]:
    client = anthropic.AsyncAnthropic(
        base_url=server.base_url, api_key=settings.get("api_key", "unused"), max_retries=0
    )
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="module")
def plain(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model served with the defaults, for the tests that need no other settings."""
    with server_thread(tiny_model) as served:
        yield served


@pytest.fixture(scope="module")
def scripted_users(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model, its output dictated for the users `SCRIPTS` names."""
    with server_thread(tiny_model, extra_processors=by_user(SCRIPTS, tiny_model)) as served:
        yield served


@pytest.fixture(scope="module")
def one_lane_no_queue(tiny_model: Path) -> Iterator[ThreadedServer]:
    with server_thread(tiny_model, max_concurrency=1, max_queue=0) as served:
        yield served


README = Path(__file__).resolve().parents[2] / "README.md"


def readme_anthropic_example() -> str:
    """README's Anthropic example, as written there."""
    blocks = README.read_text("utf-8").split("```python\n")[1:]
    (example,) = [b.split("```", 1)[0] for b in blocks if "from anthropic import" in b]
    return example


async def test_the_readmes_anthropic_example_runs_as_written(tiny_model: Path) -> None:
    """README's code, run by the installed SDK against a real server of the tiny model
    (served under the README's model name); only the port differs."""
    example = readme_anthropic_example()
    assert "temperature=" not in example  # the SDK takes it in extra_body only
    async with running_server(
        tiny_model, served_model_name="SmolLM2-135M-Instruct", skip_warmup=True
    ) as server:
        code = example.replace("http://127.0.0.1:8000", server.base_url)
        printed: list[str] = []

        def print_(*args: Any, end: str = "\n", flush: bool = False) -> None:
            printed.append(" ".join(map(str, args)) + end)

        await trio.to_thread.run_sync(lambda: exec(code, {"print": print_}))
    created, *streamed = printed
    assert created.endswith("\n") and created.strip()  # the message's text
    assert "".join(streamed).strip()  # the stream's pieces, as they came


def greedy(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": ASK, "extra_body": {"temperature": 0}, **fields}


async def named_events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a Messages stream; every event named, its name its `type`."""
    raw = (await response.aread()).decode()
    assert raw.endswith("\n\n")
    events = []
    for block in raw.split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        name = name_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        events.append((name, data))
    return events


async def test_the_sdks_model_list_and_retrieve_read_the_models_route(
    plain: ThreadedServer,
) -> None:
    """Anthropic's SDK reads /v1/models too: its fields sit beside OpenAI's."""
    async with lent(plain) as (_, client):
        page = await client.models.list()
        retrieved = await client.models.retrieve("tiny")
    (listed,) = page.data
    assert (listed.id, listed.type, listed.display_name) == ("tiny", "model", "tiny")
    assert listed.created_at.year >= 2025 and listed.created_at.tzinfo is not None
    assert (page.first_id, page.last_id, page.has_more) == ("tiny", "tiny", False)
    assert retrieved == listed


async def test_create_and_stream_give_the_same_message(plain: ThreadedServer) -> None:
    async with lent(plain) as (server, client):
        created = await client.messages.create(max_tokens=12, system="Be brief.", **greedy())
        assert created.id.startswith("msg_") and created.role == "assistant"
        assert created.stop_reason == "max_tokens" and created.stop_sequence is None
        assert created.usage.output_tokens == 12
        (block,) = created.content
        assert block.type == "text" and block.text

        async with client.messages.stream(max_tokens=12, system="Be brief.", **greedy()) as s:
            streamed = "".join([text async for text in s.text_stream])
            final = await s.get_final_message()
        assert streamed == final.content[0].text == block.text
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12
        # The prompt counts whole either way: prefilled, or read from the prefix cache.
        total = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
        assert total == created.usage.input_tokens + (created.usage.cache_read_input_tokens or 0)

        # The raw stream: Anthropic's order of named events. Twice: the second reads its
        # prompt from the prefix cache, and says so alike at its start and at its end.
        prompt_side = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            for _ in range(2):
                async with http.stream(
                    "POST",
                    "/v1/messages",
                    json={
                        "model": "tiny",
                        "messages": ASK,
                        "max_tokens": 4,
                        "stream": True,
                        "temperature": 0,  # greedy: a sampled token could end the turn early
                    },
                ) as response:
                    assert response.headers["content-type"].startswith("text/event-stream")
                    assert response.headers["request-id"] == response.headers["x-request-id"]
                    events = await named_events(response)
                names = [name for name, _ in events]
                assert names[:3] == ["message_start", "ping", "content_block_start"]
                assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
                assert set(names[3:-3]) == {"content_block_delta"}
                start = events[0][1]["message"]
                assert start["content"] == [] and start["stop_reason"] is None
                assert start["usage"]["output_tokens"] == 0
                delta = events[-2][1]
                assert delta["delta"]["stop_reason"] == "max_tokens"
                assert delta["usage"]["output_tokens"] == 4
                assert {k: start["usage"][k] for k in prompt_side} == {
                    k: delta["usage"][k] for k in prompt_side
                }
        assert delta["usage"]["cache_read_input_tokens"] > 0

        # Sampling fields: top_k 1 is greedy whatever the temperature.
        sampled = await client.messages.create(
            model="tiny", messages=ASK, max_tokens=12, system="Be brief.",
            extra_body={"temperature": 1.0, "top_k": 1, "top_p": 0.9},
        )  # fmt: skip
        assert sampled.content[0].text == block.text


async def test_a_tool_use_round_trip(scripted_users: ThreadedServer) -> None:
    async with lent(scripted_users) as (_, client):
        ask = scripted_ask("call", max_tokens=80)
        message = await client.messages.create(**ask)
        assert message.stop_reason == "tool_use"
        text, call = message.content
        assert text.type == "text" and text.text == "Let me check."
        assert call.type == "tool_use" and call.id.startswith("toolu_")
        assert call.name == "get_weather" and call.input == {"city": "Paris"}

        async with client.messages.stream(**ask) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
        assert "input_json" in kinds
        assert [b.type for b in final.content] == ["text", "tool_use"]
        assert final.content[1].input == {"city": "Paris"}

        # The result goes back as a tool_result block; the model answers the next turn.
        turn = [
            *ASK,
            message.to_param(),
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"},
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ]
        answer = await client.messages.create(
            max_tokens=4, **greedy(messages=turn, tools=[WEATHER])
        )
        assert answer.stop_reason == "max_tokens"
        counted = await client.messages.count_tokens(model="tiny", messages=turn, tools=[WEATHER])
        assert counted.input_tokens == answer.usage.input_tokens + (
            answer.usage.cache_read_input_tokens or 0
        )
        errored = [{**turn[-1]["content"][0], "is_error": True}]
        failed = await client.messages.count_tokens(
            model="tiny", messages=[*turn[:-1], {"role": "user", "content": errored}]
        )
        assert failed.input_tokens > 0


async def test_a_messages_blocks_keep_the_models_order_streamed_or_not(
    scripted_users: ThreadedServer,
) -> None:
    """Text written after a call stays after it, in a block of its own, in the body as in
    the stream (an agent replays the content as it came)."""
    async with lent(scripted_users) as (_, client):
        ask = scripted_ask("interleaved", max_tokens=120)
        message = await client.messages.create(**ask)
        async with client.messages.stream(**ask) as stream:
            final = await stream.get_final_message()
        assert [b.type for b in message.content] == ["text", "tool_use", "text", "tool_use", "text"]
        texts = [b.text for b in message.content if b.type == "text"]
        assert texts == ["First.", " Then the time.", " Done."]
        inputs = [b.input for b in message.content if b.type == "tool_use"]
        assert inputs == [{"city": "Paris"}, {"city": "Rome"}]
        assert message.stop_reason == final.stop_reason == "tool_use"
        shape = [b.model_dump(exclude={"id"}) for b in message.content]
        assert shape == [b.model_dump(exclude={"id"}) for b in final.content]


async def test_tool_choice_any_and_tool_are_enforced(plain: ThreadedServer) -> None:
    forced = [
        ({"type": "any"}, {"get_weather", "get_time"}),
        ({"type": "tool", "name": "get_time"}, {"get_time"}),
    ]
    async with lent(plain) as (_, client):
        for (choice, names), text in itertools.product(forced, ["Use a tool.", "Now another."]):
            message = await client.messages.create(
                model="tiny",
                max_tokens=120,
                messages=[{"role": "user", "content": text}],
                tools=[WEATHER, TIME],
                tool_choice={**choice, "disable_parallel_tool_use": True},
                extra_body={"temperature": 0},
            )
            assert message.stop_reason == "tool_use"
            (call,) = [b for b in message.content if b.type == "tool_use"]
            assert call.name in names
            assert set(call.input) == ({"city"} if call.name == "get_weather" else {"zone"})
        # "none" shows no tools: the model answers in text.
        plain = await client.messages.create(
            max_tokens=6, tools=[WEATHER], tool_choice={"type": "none"}, **greedy()
        )
        assert [b.type for b in plain.content] == ["text"]


async def test_stop_sequences_end_the_text_and_are_reported(
    scripted_users: ThreadedServer,
) -> None:
    async with lent(scripted_users) as (_, client):
        ask = {
            "model": "tiny",
            "max_tokens": 40,
            "messages": ASK,
            "stop_sequences": ["nothing", "there"],
            "metadata": {"user_id": "words"},
        }
        message = await client.messages.create(**ask)
        assert message.content[0].text == "Hello "
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == "there"
        async with client.messages.stream(**ask) as stream:
            assert "".join([t async for t in stream.text_stream]) == "Hello "
            final = await stream.get_final_message()
        assert final.stop_reason == "stop_sequence" and final.stop_sequence == "there"
        natural = await client.messages.create(**{**ask, "stop_sequences": []})
        assert natural.content[0].text == SCRIPTS["words"]
        assert natural.stop_reason == "end_turn" and natural.stop_sequence is None


async def test_count_tokens_prefill_and_output_format(
    tiny_model: Path, plain: ThreadedServer
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    async with lent(plain) as (_, client):
        plain = (await client.messages.count_tokens(model="tiny", messages=ASK)).input_tokens
        with_tools = await client.messages.count_tokens(model="tiny", messages=ASK, tools=[WEATHER])
        assert with_tools.input_tokens > plain
        message = await client.messages.create(max_tokens=2, **greedy())
        assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == plain
        # A last assistant message is a prefill: the reply continues it, no new turn opens.
        prefill = [*ASK, {"role": "assistant", "content": "It is"}]
        counted = (await client.messages.count_tokens(model="tiny", messages=prefill)).input_tokens
        assert counted - plain == len(tokenizer.encode("It is", add_special_tokens=False))
        continued = await client.messages.create(
            model="tiny", max_tokens=3, messages=prefill, extra_body={"temperature": 0}
        )
        assert continued.stop_reason == "max_tokens"
        # output_config.format: the text follows the schema (constrained decoding).
        schema = {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 9}},
            "required": ["ok", "n"],
            "additionalProperties": False,
        }
        shaped = await client.messages.create(
            max_tokens=60, output_config={"format": {"type": "json_schema", "schema": schema}},
            **greedy(),
        )  # fmt: skip
        assert shaped.stop_reason == "end_turn"
        assert set(json.loads(shaped.content[0].text)) == {"ok", "n"}


async def test_errors_take_anthropics_envelope_and_statuses(plain: ThreadedServer) -> None:
    async with (
        lent(plain) as (server, client),
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):

        async def refused(body: dict[str, Any], status: int, kind: str) -> str:
            response = await http.post("/v1/messages", json=body)
            assert response.status_code == status, response.text
            error = response.json()
            assert error["type"] == "error" and error["request_id"]
            assert set(error["error"]) == {"type", "message"}
            assert error["error"]["type"] == kind
            return str(error["error"]["message"])

        good = {"model": "tiny", "messages": ASK, "max_tokens": 4}
        assert "max_tokens" in await refused(
            {"model": "tiny", "messages": ASK}, 400, "invalid_request_error"
        )
        assert "nope" in await refused({**good, "model": "nope"}, 404, "not_found_error")
        block = {"role": "user", "content": [{"type": "document", "source": {}}]}
        assert "document" in await refused(
            {**good, "messages": [block]}, 400, "invalid_request_error"
        )
        assert "thinking.type" in await refused(
            {**good, "thinking": {"type": "sometimes"}}, 400, "invalid_request_error"
        )
        await refused({**good, "temperature": 1.5}, 400, "invalid_request_error")
        await refused({**good, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
                      400, "invalid_request_error")  # fmt: skip
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "aGk="}}  # fmt: skip
        assert "images" in await refused(
            {**good, "messages": [{"role": "user", "content": [image]}]},
            400,
            "invalid_request_error",
        )
        prefilled = [*ASK, {"role": "assistant", "content": "{"}]
        shaped = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
        await refused(
            {**good, "messages": prefilled, "output_config": shaped}, 400, "invalid_request_error"
        )
        response = await http.post("/v1/messages/nope", json=good)
        assert response.status_code == 404 and response.json()["type"] == "error"

        # The SDK raises its own classes for them; the server serves the next request.
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.messages.create(model="nope", max_tokens=4, messages=ASK)
        assert missing.value.type == "not_found_error"
        assert (await client.messages.create(max_tokens=2, **greedy())).usage.output_tokens == 2
        # Hints that change nothing are accepted and named.
        hinted = await http.post(
            "/v1/messages",
            json={**good, "cache_control": {"type": "ephemeral"}, "thinking": {"type": "disabled"}},
        )
        assert hinted.status_code == 200
        assert hinted.headers["x-ignored-params"] == "cache_control"
        # Thinking asked of a model that does not think: served, and named as not acted on.
        unthinking = await http.post(
            "/v1/messages", json={**good, "thinking": {"type": "enabled", "budget_tokens": 1024}}
        )
        assert unthinking.status_code == 200
        assert unthinking.headers["x-ignored-params"] == "thinking.type, thinking.budget_tokens"


async def test_x_api_key_opens_the_messages_routes(tiny_model: Path) -> None:
    async with serving(tiny_model, api_key=("sekrit",)) as (server, _):
        keyed = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="sekrit")
        bearer = anthropic.AsyncAnthropic(base_url=server.base_url, auth_token="sekrit")
        wrong = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
        try:
            assert (await keyed.messages.create(max_tokens=2, **greedy())).usage.output_tokens == 2
            assert (await bearer.messages.count_tokens(model="tiny", messages=ASK)).input_tokens
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await wrong.messages.create(max_tokens=2, **greedy())
            assert refused.value.status_code == 401
            assert refused.value.type == "authentication_error"
        finally:
            for client in (keyed, bearer, wrong):
                await client.close()


def _generated(server: Running) -> int:
    stats = engine_of(server).statistics().worker
    return stats.generated_tokens if stats else 0


@pytest.mark.parametrize("stream", [True, False])
async def test_a_disconnect_stops_compute_and_frees_the_lane(
    one_lane_no_queue: ThreadedServer, stream: bool
) -> None:
    async with lent(one_lane_no_queue) as (server, client):
        generated, late = _generated(server), engine_of(server).statistics().late_events
        body = {
            "model": "tiny",
            "messages": ASK,
            "max_tokens": LONG,
            "stream": stream,
            "temperature": 0,  # the tiny model never ends at temperature 0
        }
        connection = await raw_http(port_of(server), post_request("/v1/messages", body))
        if stream:
            await read_until(connection, b"event: content_block_delta")
        else:
            await eventually(lambda: _generated(server) > generated, "the request is generating")
        # Its lane taken and no room to queue: Anthropic's "overloaded", retry later.
        with pytest.raises(anthropic.OverloadedError) as overloaded:
            await client.messages.create(max_tokens=4, **greedy())
        assert overloaded.value.status_code == 529
        assert overloaded.value.type == "overloaded_error"
        assert overloaded.value.response.headers["retry-after"] == "1"
        await connection.aclose()
        # The disconnect gives the lane back (no queue here to wait in), and the next
        # request is served.
        lanes = engine_of(server).statistics
        await eventually(lambda: lanes().lanes_borrowed == 0, "the lane is back")
        reply = await client.messages.create(max_tokens=4, **greedy())
        assert reply.usage.output_tokens == 4
        stats = engine_of(server).statistics()
        assert stats.lanes_borrowed == 0 and stats.late_events == late
        assert _generated(server) - generated < LONG / 2, "the disconnected request kept generating"


async def test_timeouts_end_requests_in_anthropics_shape(tiny_model: Path) -> None:
    async with (
        serving(tiny_model, max_concurrency=1, request_timeout=0.5) as (server, client),
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        with pytest.raises(anthropic.GatewayTimeoutError) as timed_out:
            await client.messages.create(max_tokens=LONG, **greedy())
        assert timed_out.value.type == "timeout_error"
        body = {
            "model": "tiny",
            "messages": ASK,
            "max_tokens": LONG,
            "stream": True,
            "temperature": 0,
        }
        async with http.stream("POST", "/v1/messages", json=body) as response:
            events = await named_events(response)
        name, error = events[-1]
        assert name == "error" and error["error"]["type"] == "timeout_error"
        await eventually(lambda: engine_of(server).statistics().lanes_borrowed == 0, "lane back")


def _png(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


async def test_image_blocks_reach_a_vision_model(tiny_vlm: Path) -> None:
    async with serving(tiny_vlm) as (_, client):

        async def answer(seed: int) -> str:
            image = {"type": "base64", "media_type": "image/png", "data": _png(seed)}
            content = [{"type": "image", "source": image}, {"type": "text", "text": "What?"}]
            message = await client.messages.create(
                model="tiny",
                max_tokens=8,
                messages=[{"role": "user", "content": content}],
                extra_body={"temperature": 0},
            )
            assert message.stop_reason == "max_tokens"
            return str(message.content[0].text)

        first = await answer(1)
        assert await answer(2) != first
        assert await answer(1) == first
