"""The scripted model (`--model scripted`) over a real server, through the official SDK.

Every request runs the real path (lanes, queue, deadlines, cancellation, SSE); only the
tokens and their timing come from the request's `script`. No test asserts a duration: long
waits (a 30 s first token, a 30 s stall) are there to be cut short, and what is asserted is
what was computed (tokens, steps) and what was given back (lanes).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    engine_of,
    eventually,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
    sdk,
    server_thread,
    sse_events,
    validate,
    validate_error,
)

SCRIPTED: dict[str, Any] = {"model": ["scripted"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def ask(content: str = "Say something.", script: Any = None, **fields: Any) -> dict[str, Any]:
    """Chat arguments for the SDK (`**ask(...)`), with the script as the SDK sends extras."""
    body: dict[str, Any] = {
        "model": "scripted",
        "messages": [{"role": "user", "content": content}],
        **fields,
    }
    if script is not None:
        body["extra_body"] = {"script": script}
    return body


def body_of(content: str = "Say something.", script: Any = None, **fields: Any) -> dict[str, Any]:
    """The same request as a raw JSON body."""
    body = ask(content, **fields)
    if script is not None:
        body["script"] = script
    return body


@pytest.fixture(scope="module")
def scripted() -> Iterator[ThreadedServer]:
    """One scripted server for the tests that need nothing else: each leaves it idle, and
    compares its counters with theirs at its start."""
    with server_thread(None, **SCRIPTED) as served:
        yield served


@pytest.fixture(scope="module")
def one_lane() -> Iterator[ThreadedServer]:
    with server_thread(None, **SCRIPTED, max_concurrency=1) as served:
        yield served


def _generated(server: Any) -> int:
    stats = engine_of(server).statistics().worker
    return stats.generated_tokens if stats else 0


def _lanes(server: Any) -> int:
    return engine_of(server).statistics().lanes_borrowed


def _cancellations(server: Any) -> tuple[int, int, int]:
    """Cancellations confirmed so far, those whose stop took more than one step, and events
    that came after their request's end."""
    stats = engine_of(server).statistics()
    cancellations = stats.cancellations
    return cancellations.confirmed, sum(cancellations.steps_in_flight[2:]), stats.late_events


async def _chat(client: openai.AsyncOpenAI, stream: bool, **arguments: Any) -> dict[str, Any]:
    """One chat turn, streamed or not, as (content, tool calls, finish reason)."""
    if not stream:
        reply = await client.chat.completions.create(**arguments)
        choice = reply.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return {"content": choice.message.content, "calls": calls, "finish": choice.finish_reason}
    content, finish = "", None
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    async with await client.chat.completions.create(stream=True, **arguments) as chunks:
        async for chunk in chunks:
            choice = chunk.choices[0]
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.name:
                    names[call.index] = call.function.name
                if call.function and call.function.arguments:
                    args[call.index] = args.get(call.index, "") + call.function.arguments
            finish = choice.finish_reason or finish
    calls = [(names[i], args.get(i, "")) for i in sorted(names)]
    return {"content": content or None, "calls": calls, "finish": finish}


@pytest.mark.parametrize("stream", [False, True])
async def test_each_output_kind_through_the_sdk(scripted: ThreadedServer, stream: bool) -> None:
    async with borrowed(scripted) as server:
        client = sdk(server, max_retries=0)

        default = await _chat(client, stream, **ask())
        assert default == {"content": "This is a scripted reply.", "calls": [], "finish": "stop"}

        text = await _chat(client, stream, **ask(script={"output": {"text": "Hello, world!"}}))
        assert text == {"content": "Hello, world!", "calls": [], "finish": "stop"}

        chunks = ["The first chunk,", " a second one", " and the last."]
        chunked = await _chat(client, stream, **ask(script={"output": {"chunks": chunks}}))
        assert chunked["content"] == "".join(chunks)

        value = {"answer": 42, "items": ["a", "b"], "nested": {"ok": True}}
        as_json = await _chat(client, stream, **ask(script={"output": {"json": value}}))
        assert json.loads(as_json["content"]) == value

        echoed = await _chat(
            client, stream, **ask("Repeat after me, please.", script={"output": {"echo": True}})
        )
        assert echoed["content"] == "Repeat after me, please."

        call = {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        called = await _chat(client, stream, **ask(script={"output": call}, tools=[WEATHER]))
        assert called["finish"] == "tool_calls" and called["content"] is None
        ((name, arguments),) = called["calls"]
        assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
        assert _lanes(server) == 0


async def test_completions_and_responses_take_a_script(scripted: ThreadedServer) -> None:
    async with borrowed(scripted) as server:
        client = sdk(server, max_retries=0)
        script = {"script": {"output": {"text": "scripted words"}}}
        completion = await client.completions.create(
            model="scripted", prompt="Once upon a time", extra_body=script
        )
        assert completion.choices[0].text == "scripted words"
        echoed = await client.completions.create(
            model="scripted",
            prompt="Once upon a time",
            extra_body={"script": {"output": {"echo": True}}},
        )
        assert echoed.choices[0].text == "Once upon a time"
        response = await client.responses.create(
            model="scripted", input="Tell me a story.", extra_body=script
        )
        assert response.output_text == "scripted words"
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            raw = await http.post(
                "/v1/responses", json={"model": "scripted", "input": "Hi", **script}
            )
        validate(raw.json(), "Response")


@pytest.mark.parametrize("stream", [False, True])
async def test_max_tokens_shorter_than_the_script_gives_length(
    scripted: ThreadedServer, stream: bool
) -> None:
    async with borrowed(scripted) as server:
        generated = _generated(server)
        client = sdk(server, max_retries=0)
        script = {"output": {"text": "one two three four five six seven eight"}}
        reply = await _chat(client, stream, **ask(script=script, max_tokens=3))
        assert reply["finish"] == "length"
        assert "one two three four five six seven eight".startswith(reply["content"])
        assert reply["content"] != "one two three four five six seven eight"
        assert _generated(server) - generated == 3


async def test_each_chunk_arrives_as_written(scripted: ThreadedServer) -> None:
    """A streamed chunk comes whole, exactly as the script wrote it, in the delta of its
    arrival: a detokenizer would have held back a trailing space, or a word's end, into the
    next delta. Deltas may carry several chunks (a write takes what is ready), never part of
    one. A chunk cut by `max_tokens` gives what its tokens decode to."""
    chunks = ["Hel", "lo wor", "ld! ", "caf", "é ", "\U0001f642", "", " ok  ", " end."]
    async with borrowed(scripted) as server:
        client = sdk(server, max_retries=0)
        script = {"output": {"chunks": chunks}, "token_delay": 0.05}
        deltas: list[str] = []
        async with await client.chat.completions.create(
            stream=True, **ask(script=script)
        ) as stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    deltas.append(chunk.choices[0].delta.content)
        assert "".join(deltas) == "".join(chunks)
        boundaries = {len("".join(chunks[:i])) for i in range(len(chunks) + 1)}
        ends = [len("".join(deltas[: i + 1])) for i in range(len(deltas))]
        assert set(ends) <= boundaries, (deltas, chunks)

        encode = engine_of(server).model.tokenizer.encode
        decode = engine_of(server).model.tokenizer.decode
        first = encode("Hel", add_special_tokens=False)
        for second in ("lo wor", " world here"):  # a cut chunk keeps its leading space
            tokens = encode(second, add_special_tokens=False)
            assert len(tokens) > 1, "the cut must fall inside the second chunk"
            cut_script = {"output": {"chunks": ["Hel", second, "!"]}}
            cut = await _chat(client, True, **ask(script=cut_script, max_tokens=len(first) + 1))
            assert cut["finish"] == "length"
            assert cut["content"] == "Hel" + decode(tokens[:1])
            assert cut["content"].startswith("Hel" + second[0])

        # The first chunk's leading space stays, in the content and in its logprobs alike.
        spaced = {"output": {"chunks": [" Hi there", " ok"]}}
        reply = await client.chat.completions.create(**ask(script=spaced, logprobs=True))
        (choice,) = reply.choices
        assert choice.message.content == " Hi there ok"
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert "".join(t.token for t in choice.logprobs.content) == " Hi there ok"


async def test_error_after_n_pieces_is_an_error_after_them(scripted: ThreadedServer) -> None:
    script = {"output": {"chunks": ["one", " two", " three"]}, "fault": {"error_after": 2}}
    async with (
        borrowed(scripted) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        body = body_of(script=script, stream=True)
        async with http.stream("POST", "/v1/chat/completions", json=body) as streamed:
            assert streamed.status_code == 200
            events = await sse_events(streamed)
        assert "[DONE]" not in events
        validate_error(events[-1])
        assert events[-1]["error"]["code"] == "generation_failed"
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
        assert content == "one two"

        with pytest.raises(openai.InternalServerError) as raised:
            await sdk(server, max_retries=0).chat.completions.create(**ask(script=script))
        assert raised.value.status_code == 500
        assert _lanes(server) == 0


async def test_drop_after_n_pieces_cuts_the_connection_mid_stream(
    scripted: ThreadedServer,
) -> None:
    script = {"output": {"chunks": ["one", " two", " three"]}, "fault": {"drop_after": 2}}
    async with (
        borrowed(scripted) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        received = b""
        with pytest.raises(httpx.RemoteProtocolError):  # a chunked body that never ends
            async with http.stream(
                "POST", "/v1/chat/completions", json=body_of(script=script, stream=True)
            ) as streamed:
                assert streamed.status_code == 200
                async for data in streamed.aiter_bytes():
                    received += data
        events = [json.loads(e[6:]) for e in received.decode().split("\n\n") if e]
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        assert content == "one two" and all("error" not in e for e in events)
        await eventually(lambda: _lanes(server) == 0, "the lane came back")

        # The SDK sees a lost connection, not an error event; the server serves on.
        with pytest.raises(openai.APIConnectionError):
            async with await sdk(server, max_retries=0).chat.completions.create(
                stream=True, **ask(script=script)
            ) as chunks:
                async for _ in chunks:
                    pass
        refused = await http.post("/v1/chat/completions", json=body_of(script=script))
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "script.fault.drop_after"
        served = await sdk(server).chat.completions.create(**ask(script={"output": {"text": "ok"}}))
        assert served.choices[0].message.content == "ok"


async def test_usage_is_reported_as_the_script_says(scripted: ThreadedServer) -> None:
    script = {"output": {"text": "ok"}, "usage": {"prompt_tokens": 1000, "completion_tokens": 7}}
    async with borrowed(scripted) as server:
        client = sdk(server)
        reply = await client.chat.completions.create(**ask(script=script))
        assert reply.choices[0].message.content == "ok"
        usage = reply.usage
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (1000, 7, 1007)
        streamed = await client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **ask(script=script)
        )
        last = [chunk async for chunk in streamed][-1]
        assert last.usage is not None and last.usage.prompt_tokens == 1000
        response = await client.responses.create(
            model="scripted", input="hi", extra_body={"script": script}
        )
        assert response.usage is not None and response.usage.output_tokens == 7
        bad = {"usage": {"completion_tokens": -1}}
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(**ask(script=bad))
        assert raised.value.body["param"] == "script.usage.completion_tokens"  # type: ignore[index]


async def test_status_faults_answer_before_any_generation(scripted: ThreadedServer) -> None:
    async with (
        borrowed(scripted) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        generated = _generated(server)
        limited = await http.post(
            "/v1/chat/completions",
            json=body_of(script={"fault": {"status": 429, "retry_after": 0.25}}),
        )
        assert limited.status_code == 429
        assert limited.headers["retry-after"] == "1"  # whole seconds, as HTTP has them
        assert limited.headers["retry-after-ms"] == "250"
        validate_error(limited.json())
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"

        unavailable = await http.post(
            "/v1/chat/completions", json=body_of(script={"fault": {"status": 503}})
        )
        assert unavailable.status_code == 503 and unavailable.headers["retry-after"] == "1"
        failed = await http.post(
            "/v1/chat/completions", json=body_of(script={"fault": {"status": 500}}, stream=True)
        )
        assert failed.status_code == 500 and "retry-after" not in failed.headers
        validate_error(failed.json())

        client = sdk(server, max_retries=0)
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(**ask(script={"fault": {"status": 429}}))
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(**ask(script={"fault": {"status": 503}}))
        assert _generated(server) == generated  # none of them reached the engine


async def test_the_sdk_retries_a_scripted_429_as_retry_after_says(
    scripted: ThreadedServer,
) -> None:
    """The SDK's own retry loop against the server: 1 + max_retries attempts, each a 429,
    waiting the 10 ms that retry-after-ms asks for rather than its own backoff."""
    attempts: list[int] = []

    async def count(response: httpx.Response) -> None:
        attempts.append(response.status_code)

    async with borrowed(scripted) as server:
        http = httpx.AsyncClient(event_hooks={"response": [count]})
        async with http:
            client = sdk(server, max_retries=2, http_client=http)
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(
                    **ask(script={"fault": {"status": 429, "retry_after": 0.01}})
                )
    assert attempts == [429, 429, 429]


async def test_a_fault_on_the_first_attempts_lets_a_retry_succeed(
    scripted: ThreadedServer,
) -> None:
    """`times`: the SDK's retries of the same body meet the 429 twice, then the reply; a
    mid-stream failure likewise hits the first attempt only."""
    attempts: list[int] = []

    async def count(response: httpx.Response) -> None:
        attempts.append(response.status_code)

    script = {
        "output": {"text": "at last"},
        "fault": {"status": 429, "retry_after": 0.01, "times": 2},
    }
    async with borrowed(scripted) as server:
        http = httpx.AsyncClient(event_hooks={"response": [count]})
        async with http:
            client = sdk(server, max_retries=2, http_client=http)
            reply = await client.chat.completions.create(**ask(script=script))
        assert attempts == [429, 429, 200]
        assert reply.choices[0].message.content == "at last"

        client = sdk(server, max_retries=0)
        flaky = {
            "output": {"text": "one two"},
            "fault": {"error_after": 1, "times": 1, "key": "flaky"},
        }
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(**ask(script=flaky))
        again = await client.chat.completions.create(**ask(script=flaky))
        assert again.choices[0].message.content == "one two"
        assert _lanes(server) == 0


async def test_scripts_are_validated_strictly(scripted: ThreadedServer) -> None:
    bad = {
        "script.ttfb": {"ttfb": 1},
        "script.output.txt": {"output": {"txt": "x"}},
        "script.output": {"output": {"text": "a", "echo": True}},
        "script.ttft": {"ttft": -1},
        "script.token_delay": {"token_delay": {"min": 0.2, "max": 0.1}},
        "script.stalls[0].at": {"stalls": [{"at": -1, "seconds": 1}]},
        "script.fault.status": {"fault": {"status": 404}},
        "script.fault.retry_after": {"fault": {"status": 500, "retry_after": 1}},
        "script.fault": {"fault": {"status": 429, "error_after": 1}},
        "script.output.echo": {"output": {"echo": False}},
        "script.fault.times": {"fault": {"status": 429, "times": 0}},
    }
    async with (
        borrowed(scripted) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        generated = _generated(server)
        for param, script in bad.items():
            response = await http.post("/v1/chat/completions", json=body_of(script=script))
            assert response.status_code == 400, (param, response.text)
            validate_error(response.json())
            assert response.json()["error"]["param"] == param, response.text
        assert _generated(server) == generated


async def test_a_script_sent_to_a_real_model_is_refused(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        body = {**body_of(script={"output": {"text": "x"}}), "model": "tiny"}
        for path, request in [
            ("/v1/chat/completions", body),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "script": {}}),
            ("/v1/responses", {"model": "tiny", "input": "x", "script": {}}),
        ]:
            response = await http.post(path, json=request)
            assert response.status_code == 400, response.text
            validate_error(response.json())
            assert response.json()["error"]["param"] == "script"


async def test_without_the_harness_a_server_knows_no_script() -> None:
    """The field is the testing package's harness's (serving/_extensions.py): a server
    given no extension refuses it as any unknown field, the scripted model included."""
    async with (
        running_server(None, **SCRIPTED, harnessed=False) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        response = await http.post("/v1/chat/completions", json=body_of(script={}))
        assert response.status_code == 400, response.text
        validate_error(response.json())
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("script", "unknown_parameter")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_disconnect_while_waiting_for_the_first_token_stops_the_request(
    one_lane: ThreadedServer, stream: bool
) -> None:
    async with borrowed(one_lane) as server:
        generated, (confirmed, slow, late) = _generated(server), _cancellations(server)
        body = body_of(script={"ttft": 30}, stream=stream)
        connection = await raw_http(port_of(server), post_request("/v1/chat/completions", body))
        if stream:
            await read_until(connection, b"data: ")  # the stream is open, its token 30 s away
        await eventually(lambda: _lanes(server) == 1, "the request holds the lane")
        await connection.aclose()
        await eventually(lambda: _lanes(server) == 0, "the lane came back")
        assert _generated(server) == generated
        # One cancellation, stopped within a step, and no event after its end.
        assert _cancellations(server) == (confirmed + 1, slow, late)
        # The one lane serves the next request at once.
        reply = await sdk(server).chat.completions.create(**ask(script={"output": {"text": "ok"}}))
        assert reply.choices[0].message.content == "ok"


async def test_an_sdk_timeout_stops_the_request_on_the_server(scripted: ThreadedServer) -> None:
    """The client gives up (its own timeout); the server sees the disconnect and stops."""
    async with borrowed(scripted) as server:
        generated, (confirmed, _, _) = _generated(server), _cancellations(server)
        client = sdk(server, timeout=0.5, max_retries=0)
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(**ask(script={"ttft": 30}))
        await eventually(lambda: _lanes(server) == 0, "the lane came back")
        assert _generated(server) == generated
        assert _cancellations(server)[0] == confirmed + 1


async def test_the_request_timeout_stops_a_scripted_wait() -> None:
    async with (
        running_server(None, **SCRIPTED, request_timeout=0.5) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        response = await http.post("/v1/chat/completions", json=body_of(script={"ttft": 30}))
        assert response.status_code == 504
        assert response.headers["x-should-retry"] == "false"
        assert response.json()["error"]["code"] == "request_timeout"
        body = body_of(script={"output": {"text": "a b c"}, "stalls": [{"at": 1, "seconds": 30}]})
        async with http.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}
        ) as streamed:
            events = await sse_events(streamed)
        assert events[-1]["error"]["code"] == "request_timeout"
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "a"
        assert _lanes(server) == 0
        assert _generated(server) == 1  # the stalled token was never produced


async def test_a_caller_that_stops_reading_during_a_stall_frees_the_lane(
    scripted: ThreadedServer,
) -> None:
    """The stall holds the third chunk back; the caller closes the stream after the second:
    nothing after it is computed, the lane is back, and the engine stopped within one step."""
    script = {
        "output": {"chunks": ["zero", " one", " two", " three"]},
        "stalls": [{"at": 2, "seconds": 30}],
    }
    async with borrowed(scripted) as server:
        generated, (confirmed, slow, _) = _generated(server), _cancellations(server)
        client = sdk(server, max_retries=0)
        seen = ""
        async with await client.chat.completions.create(
            stream=True, **ask(script=script)
        ) as chunks:
            async for chunk in chunks:
                seen += chunk.choices[0].delta.content or ""
                if seen == "zero one":
                    break
        await eventually(lambda: _lanes(server) == 0, "the lane came back")
        encode = engine_of(server).model.tokenizer.encode
        assert _generated(server) - generated == sum(len(encode(c)) for c in ["zero", " one"])
        assert _cancellations(server)[:2] == (confirmed + 1, slow)


async def test_shutdown_ends_a_scripted_wait_with_an_error_event() -> None:
    async with running_server(None, **SCRIPTED) as server:
        body = body_of(script={"ttft": 30}, stream=True)
        connection = await raw_http(port_of(server), post_request("/v1/chat/completions", body))
        await read_until(connection, b"data: ")
        await eventually(lambda: _lanes(server) == 1, "the request holds the lane")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.service.drain, 0.0)
            tail = await read_until(connection, b"server_shutting_down")
        assert b"[DONE]" not in tail
        await eventually(lambda: _lanes(server) == 0, "the lane came back")
        assert _generated(server) == 0
        await connection.aclose()


async def test_a_script_file_is_the_default(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"output": {"chunks": ["from ", "the file"]}}))
    async with running_server(None, **SCRIPTED, script=str(path)) as server:
        client = sdk(server, max_retries=0)
        reply = await client.chat.completions.create(**ask())
        assert reply.choices[0].message.content == "from the file"
        own = await client.chat.completions.create(**ask(script={"output": {"text": "mine"}}))
        assert own.choices[0].message.content == "mine"
