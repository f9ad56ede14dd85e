"""/v1/responses through the real server, the official SDK and the OpenAPI schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.http.test_http_tools import ONE_CALL, WEATHER
from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
    scripted,
    sdk,
    server_thread,
    validate,
    validate_error,
)

SCRIPTS = {"call": ONE_CALL, "hello": "Hello there, traveller."}
FLAT_WEATHER = {
    "type": "function",
    "name": WEATHER["function"]["name"],
    "description": WEATHER["function"]["description"],
    "parameters": WEATHER["function"]["parameters"],
    "strict": False,
}


def _validate_response(response: Any) -> None:
    validate(
        response.model_dump(exclude_unset=True) if hasattr(response, "model_dump") else response,
        "Response",
    )


@pytest.fixture(scope="module")
def plain(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model served with the defaults, for the tests that need no other settings."""
    with server_thread(tiny_model) as served:
        yield served


@pytest.fixture(scope="module")
def scripted_users(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model, its output dictated for the users `SCRIPTS` names."""
    with server_thread(tiny_model, extra_processors=scripted(SCRIPTS, tiny_model)) as served:
        yield served


async def test_create_retrieve_delete_and_input_items(scripted_users: ThreadedServer) -> None:
    async with borrowed(scripted_users) as server:
        client = sdk(server)
        created = await client.responses.create(
            model="tiny",
            input="Greet me.",
            user="hello",
            max_output_tokens=40,
            temperature=0,
            safety_identifier="user-7",
            prompt_cache_key="greetings",
        )
        _validate_response(created)
        assert created.id.startswith("resp_") and created.status == "completed"
        assert created.completed_at is not None and created.completed_at >= created.created_at
        assert (created.safety_identifier, created.prompt_cache_key) == ("user-7", "greetings")
        assert created.output_text == "Hello there, traveller."
        (message,) = created.output
        assert message.id.startswith("msg_") and message.content[0].annotations == []
        usage = created.usage
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens
        assert (
            usage.input_tokens_details.cache_write_tokens + usage.input_tokens_details.cached_tokens
            == usage.input_tokens
        )

        again = await client.responses.retrieve(created.id)
        assert again.model_dump() == created.model_dump()
        items = await client.responses.input_items.list(created.id)
        validate(items.model_dump(exclude_unset=True), "ResponseItemList")
        assert [i.type for i in items.data] == ["message"]
        assert items.data[0].content[0].text == "Greet me."

        deleted = await client.responses.delete(created.id)
        assert deleted is None or getattr(deleted, "deleted", True)
        with pytest.raises(openai.NotFoundError) as missing:
            await client.responses.retrieve(created.id)
        validate_error(
            missing.value.body
            if isinstance(missing.value.body, dict) and "error" in missing.value.body
            else {"error": missing.value.body}
        )


async def test_store_false_is_not_retrievable(plain: ThreadedServer) -> None:
    async with borrowed(plain) as server:
        client = sdk(server)
        created = await client.responses.create(
            model="tiny", input="x", store=False, max_output_tokens=3
        )
        assert created.store is False
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="tiny", input="y", previous_response_id=created.id)


async def test_max_output_tokens_gives_incomplete(plain: ThreadedServer) -> None:
    async with borrowed(plain) as server:
        created = await sdk(server).responses.create(
            model="tiny", input="x", max_output_tokens=4, temperature=0
        )
    _validate_response(created)
    assert created.status == "incomplete"
    assert created.incomplete_details.reason == "max_output_tokens"
    assert created.usage.output_tokens == 4
    assert created.completed_at is None


async def test_stream_with_the_sdk_state_machine(scripted_users: ThreadedServer) -> None:
    async with borrowed(scripted_users) as server:
        client = sdk(server)
        events = []
        async with client.responses.stream(
            model="tiny", input="Greet me.", user="hello", max_output_tokens=40
        ) as stream:
            async for event in stream:
                events.append(event)
            final = await stream.get_final_response()
        calls = []
        async with client.responses.stream(
            model="tiny", input="Weather?", user="call", tools=[FLAT_WEATHER], max_output_tokens=80
        ) as stream:
            async for event in stream:
                calls.append(event)
            with_call = await stream.get_final_response()
    for event in events + calls:
        validate(event.model_dump(exclude_unset=True), "ResponseStreamEvent")
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert (
        "".join(e.delta for e in events if e.type == "response.output_text.delta")
        == final.output_text
    )
    assert final.output_text == "Hello there, traveller."
    kinds = [e.type for e in calls]
    assert kinds.index("response.function_call_arguments.done") > kinds.index(
        "response.output_item.added"
    )
    call = next(item for item in with_call.output if item.type == "function_call")
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert with_call.output[0].type == "message" and with_call.output_text == "Let me check."


def _http_chunks(raw: bytes) -> list[bytes]:
    """The chunks of a chunked HTTP/1.1 body: one per write the server made."""
    body = raw.split(b"\r\n\r\n", 1)[1]
    chunks = []
    while True:
        size_line, body = body.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return chunks
        chunks.append(body[:size])
        body = body[size + 2 :]


async def test_stream_interval_applies_to_response_streams(tiny_model: Path) -> None:
    """--stream-interval 4: 17 tokens go out in at most 1 + 16/4 writes, each write's text in
    one delta event; logprobs count the tokens in each."""
    body = {
        "model": "tiny",
        "input": "Tell a tale.",
        "stream": True,
        "max_output_tokens": 17,
        "temperature": 0,
        "include": ["message.output_text.logprobs"],
    }
    async with running_server(tiny_model, stream_interval=4) as server:
        connection = await raw_http(port_of(server), post_request("/v1/responses", body))
        raw = await read_until(connection, b"\r\n0\r\n\r\n")
        await connection.aclose()
    writes = [
        [
            json.loads(line[6:])
            for line in chunk.splitlines()
            if line.startswith(b"data: ") and b"response.output_text.delta" in line
        ]
        for chunk in _http_chunks(raw)
    ]
    writes = [deltas for deltas in writes if deltas]
    final = [json.loads(line[6:]) for line in raw.splitlines() if b'"response.incomplete"' in line]
    assert all(len(deltas) == 1 for deltas in writes), writes
    tokens = [len(deltas[0]["logprobs"]) for deltas in writes]
    assert sum(tokens) == 17
    assert all(n >= 4 for n in tokens[1:-1]), tokens
    assert 1 < len(writes) <= 1 + 16 // 4, tokens
    text = "".join(deltas[0]["delta"] for deltas in writes)
    assert text == final[-1]["response"]["output"][0]["content"][0]["text"]


async def test_previous_response_chain_and_function_call_round_trip(
    tiny_model: Path, tmp_path: Path
) -> None:
    db = tmp_path / "responses.db"
    async with running_server(
        tiny_model, extra_processors=scripted(SCRIPTS, tiny_model), responses_db=str(db)
    ) as server:
        client = sdk(server)
        first = await client.responses.create(
            model="tiny",
            input="Weather in Paris?",
            user="call",
            tools=[FLAT_WEATHER],
            instructions="Be brief.",
            max_output_tokens=80,
        )
        call = next(item for item in first.output if item.type == "function_call")
        second = await client.responses.create(
            model="tiny",
            previous_response_id=first.id,
            tools=[FLAT_WEATHER],
            user="hello",
            input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}
            ],
            max_output_tokens=40,
        )
        _validate_response(second)
        assert second.previous_response_id == first.id and second.instructions is None
        # Without the instructions the prompt would shrink; the call and its output make it grow.
        assert second.usage.input_tokens > first.usage.input_tokens
        # A tool's output as content parts (the Agents SDK's for structured results): the same.
        parts = [{"type": "input_text", "text": '{"temp": '}, {"type": "input_text", "text": "21}"}]
        in_parts = await client.responses.create(
            model="tiny",
            previous_response_id=first.id,
            tools=[FLAT_WEATHER],
            user="hello",
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": parts}],
            max_output_tokens=40,
        )
        assert in_parts.usage.input_tokens == second.usage.input_tokens
        listed = await client.responses.input_items.list(in_parts.id)
        assert [p.text for p in listed.data[0].output] == ['{"temp": ', "21}"]  # type: ignore[union-attr]
    # A restart on the same database file: the chain continues.
    async with running_server(tiny_model, responses_db=str(db)) as server:
        client = sdk(server)
        kept = await client.responses.retrieve(second.id)
        assert kept.output_text == "Hello there, traveller."
        third = await client.responses.create(
            model="tiny",
            previous_response_id=second.id,
            tools=[FLAT_WEATHER],
            input="And tomorrow?",
            max_output_tokens=3,
        )
        assert third.usage.input_tokens > second.usage.input_tokens
        items = await client.responses.input_items.list(second.id)
        assert [i.type for i in items.data] == ["function_call_output"]


async def test_responses_errors(plain: ThreadedServer) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"model": "tiny", "input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        (
            {
                "model": "tiny",
                "input": "x",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"type": "string", "format": "not-a-format"},
                    }
                },
            },
            400,
            "text.format.schema",
        ),
        ({"model": "tiny", "input": "x", "background": True, "store": False}, 400, "background"),
        ({"model": "tiny", "input": []}, 400, "input"),
        ({"model": "tiny", "input": [{"type": "input_image"}]}, 400, "input[0].type"),
        (
            {"model": "tiny", "input": "x", "previous_response_id": "resp_nope"},
            404,
            "previous_response_id",
        ),
        ({"model": "nope", "input": "x"}, 404, "model"),
        ({"model": "tiny", "input": "x", "metadata": {"k": "v" * 513}}, 400, "metadata"),
        ({"model": "tiny", "input": "x", "metadata": {"k" * 65: "v"}}, 400, "metadata"),
        ({"model": "tiny", "input": "x", "max_output_tokens": 10**9}, 400, "input"),
    ]
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        for body, status, param in cases:
            response = await http.post("/v1/responses", json=body)
            assert response.status_code == status, (body, response.text)
            validate_error(response.json())
            assert response.json()["error"]["param"] == param
        page = await http.get("/v1/responses/resp_missing/input_items")
        assert page.status_code == 404


async def test_concurrent_responses_are_all_stored(tiny_model: Path, tmp_path: Path) -> None:
    import trio

    async with running_server(tiny_model, responses_db=str(tmp_path / "r.db")) as server:
        client = sdk(server)
        ids: list[str] = []

        async def one(i: int) -> None:
            created = await client.responses.create(
                model="tiny", input=f"request {i}", max_output_tokens=3
            )
            ids.append(created.id)

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
        for response_id in ids:
            assert (await client.responses.retrieve(response_id)).id == response_id
        assert len(set(ids)) == 8


async def test_a_committed_response_survives_kill_9(tiny_model: Path, tmp_path: Path) -> None:
    import signal

    import trio

    from tests.http.test_http_cancellation import spawned_server

    db = str(tmp_path / "r.db")
    async with spawned_server(tiny_model, "--served-model-name", "tiny", "--responses-db", db) as (
        process,
        port,
    ):
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        created = await client.responses.create(model="tiny", input="keep me", max_output_tokens=3)
        process.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(process.wait)
    async with running_server(tiny_model, responses_db=db) as server:
        kept = await sdk(server).responses.retrieve(created.id)
    assert kept.id == created.id and kept.status == created.status


async def test_disconnecting_a_response_stream_frees_the_lane(tiny_model: Path) -> None:
    from tests.http_helpers import engine_of, port_of, post_request, raw_http, read_until

    async with running_server(tiny_model, max_concurrency=1) as server:
        body = {
            "model": "tiny",
            "input": "go",
            "stream": True,
            "max_output_tokens": 3000,
            "temperature": 0,
        }
        connection = await raw_http(port_of(server), post_request("/v1/responses", body))
        await read_until(connection, b"response.output_text.delta")
        await connection.aclose()
        reply = await sdk(server).responses.create(
            model="tiny", input="next", max_output_tokens=2, temperature=0
        )
        assert reply.usage.output_tokens == 2
        stats = engine_of(server).statistics()
        assert stats.lanes_borrowed == 0 and stats.worker is not None
        assert stats.worker.generated_tokens < 1500
