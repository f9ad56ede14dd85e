"""Hostile and odd input through a real Hypercorn server: every case is a 4xx in OpenAI's
envelope naming its parameter, streams always end with an event, limits apply before work,
and the next request is served as usual.

One server serves the whole module, on a thread of its own (a Trio run per thread), so the
many cases cost one model load. Its test-only `extra_processors` hook runs where a request is
prepared, which lets a test hold a preparation open and look at the server meanwhile.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from mlx_nursery.generation._json import MAX_JSON_DEPTH
from mlx_nursery.generation._plan import Prepared
from mlx_nursery.http._limits import HYPERCORN_HEAD_BYTES, MAX_HEADER_BYTES, MAX_URL_BYTES
from mlx_nursery.openai._responses_output import ResponseBuilder
from mlx_nursery.server import Running
from tests.http_helpers import (
    chat_body,
    raw_http,
    server_thread,
    sse_events,
    validate,
    validate_error,
)

MAX_REQUEST_BYTES = 1 << 20  # the module's server; the default (8 MiB) only costs time here
VOCAB = 2048  # the tiny model's


@attrs.define
class Hold:
    """Holds the preparation of a request whose `user` is "hold" until released."""

    entered: threading.Event = attrs.field(factory=threading.Event)
    release: threading.Event = attrs.field(factory=threading.Event)
    thread: int | None = None

    def __call__(self, body: Any) -> tuple[Any, ...]:
        if isinstance(body, dict) and body.get("user") == "hold":
            self.thread = threading.get_ident()
            self.entered.set()
            assert self.release.wait(60), "the test never released the preparation"
        return ()


@attrs.frozen
class Hosted:
    running: Running
    trio_thread: int
    hold: Hold

    @property
    def base_url(self) -> str:
        return self.running.base_url

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Hosted]:
    hold = Hold()
    with server_thread(
        tiny_model, extra_processors=hold, max_request_bytes=MAX_REQUEST_BYTES
    ) as served:
        yield Hosted(served.running, served.trio_thread, hold)


@pytest.fixture
async def http(server: Hosted) -> Any:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        yield client


async def assert_still_serving(http: httpx.AsyncClient) -> None:
    health = await http.get("/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ok = await http.post("/v1/chat/completions", json=chat_body(max_tokens=2, temperature=0))
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 2


def assert_envelope(
    response: httpx.Response, status: int, param: str | None, code: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    validate_error(body)
    assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body
    assert "Traceback" not in response.text
    return body["error"]  # type: ignore[no-any-return]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def chat_json(**fields: Any) -> str:
    """A chat body as JSON text; a field given as `RAW(text)` is spliced in as raw JSON."""
    return _splice({**chat_body("hi", max_tokens=2), **fields})


@attrs.frozen
class RAW:
    text: str


def _splice(body: dict[str, Any]) -> str:
    raws: dict[str, str] = {}

    def mark(value: Any) -> Any:
        if isinstance(value, RAW):
            key = f"\x00raw{len(raws)}\x00"
            raws[json.dumps(key)] = value.text
            return key
        if isinstance(value, dict):
            return {mark(k): mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(body))
    for key, raw in raws.items():
        text = text.replace(key, raw)
    return text


def responses_json(**fields: Any) -> str:
    return _splice({"model": "tiny", "input": "hi", "max_output_tokens": 2, **fields})


def completions_json(**fields: Any) -> str:
    return _splice({"model": "tiny", "prompt": "hi", "max_tokens": 2, **fields})


CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SURROGATE = RAW('"a\\ud800b"')

# (path, JSON text, status, param, code)
CASES: list[tuple[str, str, int, str | None, str | None]] = [
    # 1. depth, non-JSON literals, huge numbers
    (
        CHAT,
        chat_json(messages=[{"role": "user", "content": RAW(nested(1000))}]),
        400,
        None,
        "json_too_deep",
    ),
    (
        CHAT,
        chat_json(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": RAW(
                            '{"type": "object", "properties": {"a": ' + nested(1000) + "}}"
                        ),
                    },
                }
            ]
        ),
        400,
        None,
        "json_too_deep",
    ),
    (
        CHAT,
        chat_json(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": RAW('{"a": ' + nested(1000) + "}")},
            }
        ),
        400,
        None,
        "json_too_deep",
    ),
    (
        RESPONSES,
        responses_json(
            text={"format": {"type": "json_schema", "name": "x", "schema": RAW(nested(1000))}}
        ),
        400,
        None,
        "json_too_deep",
    ),
    (RESPONSES, responses_json(input=RAW(nested(1000))), 400, None, "json_too_deep"),
    (
        CHAT,
        chat_json(
            response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
        ),
        400,
        "response_format.json_schema.name",
        "missing_required_parameter",
    ),
    (
        RESPONSES,
        responses_json(text={"format": {"type": "json_schema", "name": "a b", "schema": {}}}),
        400,
        "text.format.name",
        "invalid_value",
    ),
    (CHAT, '{"model": "tiny", "messages": ' + "[" * 100_000, 400, None, "json_too_deep"),
    (
        CHAT,
        chat_json(
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": nested(1000)},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
        ),
        400,
        "messages[1].tool_calls[0].function.arguments",
        "json_too_deep",
    ),
    (CHAT, chat_json(temperature=RAW("NaN")), 400, None, "invalid_json"),
    (CHAT, chat_json(temperature=RAW("Infinity")), 400, None, "invalid_json"),
    (CHAT, chat_json(logit_bias={"5": RAW("-Infinity")}), 400, None, "invalid_json"),
    (CHAT, chat_json(temperature=RAW("1e999")), 400, None, "invalid_json"),
    (CHAT, chat_json(max_tokens=RAW("9" * 5000)), 400, None, "invalid_json"),
    (CHAT, chat_json(temperature=RAW("1" + "0" * 400)), 400, "temperature", None),
    (
        CHAT,
        '{"model": "tiny", "messages": [{"role": "user", "content": "\xff"}]}',
        400,
        None,
        "invalid_json",
    ),  # sent as latin-1 below: not UTF-8
    # 2. lone surrogates, named by path
    (
        CHAT,
        chat_json(messages=[{"role": "user", "content": SURROGATE}]),
        400,
        "messages[0].content",
        "invalid_value",
    ),
    (
        CHAT,
        chat_json(messages=[{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]),
        400,
        "messages[0].content[0].text",
        "invalid_value",
    ),
    (CHAT, chat_json(user=SURROGATE), 400, "user", "invalid_value"),
    (
        CHAT,
        chat_json(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {RAW('"\\udc00"'): {}}},
                    },
                }
            ]
        ),
        400,
        "tools[0].function.parameters.properties",
        "invalid_value",
    ),
    (COMPLETIONS, completions_json(prompt=SURROGATE), 400, "prompt", "invalid_value"),
    (RESPONSES, responses_json(user=SURROGATE), 400, "user", "invalid_value"),
    (RESPONSES, responses_json(user=SURROGATE, stream=True), 400, "user", "invalid_value"),
    (
        RESPONSES,
        responses_json(metadata={"k": SURROGATE}, stream=True),
        400,
        "metadata.k",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(previous_response_id=SURROGATE),
        400,
        "previous_response_id",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(
            input=[{"role": "user", "content": [{"type": "input_text", "text": SURROGATE}]}]
        ),
        400,
        "input[0].content[0].text",
        "invalid_value",
    ),
    # 3. specific 500s
    (CHAT, chat_json(logit_bias={"²": 1}), 400, "logit_bias", "invalid_value"),
    (CHAT, chat_json(logit_bias={"1" * 40: 1}), 400, "logit_bias", "invalid_value"),
    (CHAT, chat_json(logit_bias={"99999": 1}), 400, "logit_bias", "invalid_value"),
    (
        CHAT,
        chat_json(tools=[TOOL], tool_choice={"type": "function", "function": "f"}),
        400,
        "tool_choice.function",
        "invalid_value",
    ),
    (
        CHAT,
        chat_json(tools=[TOOL], tool_choice={"type": "function", "function": {"name": ["f"]}}),
        400,
        "tool_choice.function.name",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(tools=[TOOL], tool_choice={"type": "function", "function": "f"}),
        400,
        "tool_choice.function",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(tool_choice={"type": "function", "function": "f"}),
        400,
        "tool_choice.function",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(tool_choice={"type": "file_search"}),
        400,
        "tool_choice",
        "invalid_value",
    ),
    (
        CHAT,
        chat_json(tool_choice={"type": "function", "function": {"name": "f"}}),
        400,
        "tool_choice",
        "invalid_value",
    ),
    (CHAT, chat_json(tool_choice="required"), 400, "tool_choice", "invalid_value"),
    (CHAT, chat_json(tool_choice="sometimes"), 400, "tool_choice", "invalid_value"),
    (
        RESPONSES,
        responses_json(input=[{"type": "reasoning", "summary": "thinking"}]),
        400,
        "input[0].summary",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(input=[{"type": "reasoning", "summary": [1]}]),
        400,
        "input[0].summary[0]",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(input=[{"type": "reasoning", "summary": [{"type": "summary_text"}]}]),
        400,
        "input[0].summary[0].text",
        "missing_required_parameter",
    ),
    (
        RESPONSES,
        responses_json(input=[{"type": "reasoning", "summary": [], "content": [{"text": 5}]}]),
        400,
        "input[0].content[0].text",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(input=[{"role": "user", "content": "x", "id": ["x"]}]),
        400,
        "input[0].id",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(text={"format": {"type": "json_schema", "name": [1], "schema": {}}}),
        400,
        "text.format.name",
        "invalid_value",
    ),
    (
        RESPONSES,
        responses_json(text={"format": {"type": "json_object", "frobnicate": 1}}),
        400,
        "text.format.frobnicate",
        "unknown_parameter",
    ),
    (
        RESPONSES,
        responses_json(text={"verbosity": "high", "tone": "dry"}),
        400,
        "text.tone",
        "unknown_parameter",
    ),
    (CHAT, chat_json(seed=2**63), 400, "seed", None),
    (CHAT, chat_json(seed=-(2**63) - 1), 400, "seed", None),
    (COMPLETIONS, completions_json(seed=2**64), 400, "seed", None),
    (RESPONSES, responses_json(seed=1), 400, "seed", "unknown_parameter"),
    (CHAT, chat_json(top_k=2**63), 400, "top_k", None),
    (CHAT, chat_json(max_tokens=2**63 - 1), 400, "messages", "context_length_exceeded"),
    (CHAT, chat_json(max_tokens=2**64), 400, "max_tokens", None),
    (CHAT, chat_json(max_completion_tokens=-(2**70)), 400, "max_completion_tokens", None),
    (CHAT, chat_json(logprobs=True, top_logprobs=2**64), 400, "top_logprobs", None),
    (CHAT, chat_json(logprobs=True, top_logprobs=2**62), 400, "top_logprobs", "invalid_value"),
    (CHAT, chat_json(n=2**64), 400, "n", None),
    (CHAT, chat_json(n=2**62), 400, "n", "unsupported_parameter"),
    (COMPLETIONS, completions_json(logprobs=2**70), 400, "logprobs", None),
    (COMPLETIONS, completions_json(prompt=[1, 2**64]), 400, "prompt[1]", None),
    (RESPONSES, responses_json(max_output_tokens=2**64), 400, "max_output_tokens", None),
    (RESPONSES, responses_json(top_logprobs=2**63), 400, "top_logprobs", None),
    # 7. far beyond the context: refused before tokenizing
    (
        CHAT,
        chat_json(messages=[{"role": "user", "content": "a" * 600_000}]),
        400,
        "messages",
        "context_length_exceeded",
    ),
    (COMPLETIONS, completions_json(prompt="a" * 600_000), 400, "prompt", "context_length_exceeded"),
    (RESPONSES, responses_json(input="a" * 600_000), 400, "input", "context_length_exceeded"),
    (
        CHAT,
        chat_json(
            tools=[{"type": "function", "function": {"name": "f", "description": "d" * 600_000}}]
        ),
        400,
        "messages",
        "context_length_exceeded",
    ),
    (
        CHAT,
        chat_json(
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {
                                "name": "f",
                                "arguments": json.dumps({"a": "b" * 600_000}),
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
        ),
        400,
        "messages",
        "context_length_exceeded",
    ),
]


@pytest.mark.parametrize(
    ("path", "text", "status", "param", "code"),
    CASES,
    ids=[f"{i}-{c[0].removeprefix('/v1/').replace('/', '.')}-{c[3]}" for i, c in enumerate(CASES)],
)
async def test_hostile_input_is_a_4xx_in_the_envelope(
    http: httpx.AsyncClient,
    path: str,
    text: str,
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    content = text.encode("latin-1") if "\xff" in text else text.encode()
    response = await http.post(path, content=content, headers={"Content-Type": "application/json"})
    assert_envelope(response, status, param, code)
    await assert_still_serving(http)


async def test_the_depth_limit_is_exact(http: httpx.AsyncClient) -> None:
    """A tool call's arguments are a JSON document of their own: MAX_JSON_DEPTH levels pass."""

    def body(depth: int) -> dict[str, Any]:
        arguments = '{"a": ' + nested(depth - 1) + "}"
        return chat_body(
            max_tokens=1,
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": arguments},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ],
        )

    assert (await http.post(CHAT, json=body(MAX_JSON_DEPTH))).status_code == 200
    assert_envelope(
        await http.post(CHAT, json=body(MAX_JSON_DEPTH + 1)),
        400,
        "messages[1].tool_calls[0].function.arguments",
        "json_too_deep",
    )


@pytest.mark.parametrize("path", [CHAT, RESPONSES])
async def test_a_forced_call_with_a_json_format_is_the_call(
    http: httpx.AsyncClient, path: str
) -> None:
    """Both constrain the output; the call wins (it leaves no content to format). Applied
    together, the two grammars left no token allowed and the generation failed (a 500)."""
    function = {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["CET", "UTC"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    }
    tools = (
        [{"type": "function", "function": function}]
        if path == CHAT
        else [{"type": "function", **function}]
    )
    fields: dict[str, Any] = {"tools": tools, "tool_choice": "required", "temperature": 0}
    if path == CHAT:
        body = chat_body(max_tokens=120, response_format={"type": "json_object"}, **fields)
    else:
        body = {
            "model": "tiny",
            "input": "hi",
            "max_output_tokens": 120,
            "text": {"format": {"type": "json_object"}},
            **fields,
        }
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    if path == CHAT:
        calls = response.json()["choices"][0]["message"]["tool_calls"]
    else:
        calls = [item for item in response.json()["output"] if item["type"] == "function_call"]
    assert len(calls) == 1
    bad_schema = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "string", "format": "not-a-format"}},
    }
    assert_envelope(
        await http.post(
            CHAT, json=chat_body(response_format=bad_schema, tools=[TOOL], tool_choice="required")
        ),
        400,
        "response_format.json_schema.schema",
    )
    await assert_still_serving(http)


@pytest.mark.parametrize(
    "vanishing",
    [
        {"top_p": 1e-300},
        {"top_p": 1e-50},
        {"top_p": 1 / VOCAB},
        {"temperature": 5e-324},
        {"temperature": 1e-40},
    ],
    ids=["top_p=1e-300", "top_p=1e-50", "top_p=1/V", "T=5e-324", "T=1e-40"],
)
@pytest.mark.parametrize("constrained", [False, True], ids=["free", "json_schema"])
async def test_vanishing_top_p_or_temperature_is_greedy(
    http: httpx.AsyncClient, vanishing: dict[str, float], constrained: bool
) -> None:
    """The most likely token each time, as greedy decoding. Values that are 0 (or whose
    inverse is inf) in float32 made the engine drop every token or draw from NaN: random
    output, and a 500 under a grammar."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
        "required": ["a"],
        "additionalProperties": False,
    }
    extra = (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        if constrained
        else {}
    )
    tiny = await http.post(
        CHAT,
        json=chat_body("hi", max_tokens=6, **{"temperature": 1.0, "seed": 3, **vanishing, **extra}),
    )
    assert tiny.status_code == 200, tiny.text
    greedy = await http.post(CHAT, json=chat_body("hi", max_tokens=6, temperature=0, **extra))
    assert tiny.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]
    await assert_still_serving(http)


@pytest.mark.parametrize("top_k", [VOCAB, VOCAB + 1, 2**62])
async def test_top_k_beyond_the_vocabulary_is_no_top_k(http: httpx.AsyncClient, top_k: int) -> None:
    """Same distribution as top_k 0: with a seed, the same tokens; and the engine stays healthy
    for the unseeded sampling that follows."""

    def body(k: int | None) -> dict[str, Any]:
        return chat_body("Tell me a story.", max_tokens=8, temperature=1.0, seed=5, top_k=k)

    clamped = await http.post(CHAT, json=body(top_k))
    assert clamped.status_code == 200, clamped.text
    plain = await http.post(CHAT, json=body(None))
    assert clamped.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    unseeded = await http.post(CHAT, json=chat_body(max_tokens=4, temperature=1.0, top_k=top_k))
    assert unseeded.status_code == 200, unseeded.text
    await assert_still_serving(http)


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        (CHAT, {**chat_body(), "model": "m" * 1_000_000}, 404, "model"),
        (CHAT, {**chat_body(), "x" * 1_000_000: 1}, 400, "x" * 80 + "…"),
        (CHAT, chat_body(logit_bias={"y" * 1_000_000: 1}), 400, "logit_bias"),
        (CHAT, chat_body(tools=[{"type": "z" * 1_000_000}]), 400, "tools[0].type"),
        (
            CHAT,
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": [{"type": "w" * 1_000_000, "text": "x"}]}],
            },
            400,
            "messages[0].content[0].type",
        ),
        (
            RESPONSES,
            {"model": "tiny", "input": [{"role": "v" * 1_000_000, "content": "x"}]},
            400,
            "input[0].role",
        ),
        (RESPONSES, {"model": "tiny", "input": [{"type": "u" * 1_000_000}]}, 400, "input[0].type"),
        (
            RESPONSES,
            {"model": "tiny", "input": "x", "previous_response_id": "t" * 1_000_000},
            404,
            "previous_response_id",
        ),
    ],
)
async def test_error_messages_quote_a_short_prefix(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    response = await http.post(path, json=body)
    error = assert_envelope(response, status, param)
    assert len(response.content) < 1000
    assert "…" in error["message"], error


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("application/jsonx", 415),
        ("application/json; charset=latin-1", 415),
        ("", 415),
        ("application/json", 200),
        ("Application/JSON; charset=UTF-8", 200),
        (None, 200),
    ],
)
async def test_content_types(
    http: httpx.AsyncClient, content_type: str | None, status: int
) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    request = http.build_request(
        "POST", CHAT, content=json.dumps(chat_body(max_tokens=1)).encode(), headers=headers
    )
    assert ("content-type" in request.headers) == (content_type is not None)
    response = await http.send(request)
    if status == 200:
        assert response.status_code == 200, response.text
    else:
        assert_envelope(response, status, None, "unsupported_media_type")
    await assert_still_serving(http)


async def raw_response(
    port: int, head: bytes, body_chunks: Sequence[bytes] = ()
) -> tuple[int, bytes]:
    """Send `head` and `body_chunks` on a fresh connection; the status and body of the answer."""
    stream = await raw_http(port, head)
    async with stream:
        for chunk in body_chunks:
            await stream.send_all(chunk)
        data = b""
        while b"\r\n\r\n" not in data:
            piece = await stream.receive_some(65536)
            assert piece, f"closed before a response: {data!r}"
            data += piece
        head_part, _, rest = data.partition(b"\r\n\r\n")
        status = int(head_part.split(b" ", 2)[1])
        headers = dict(line.split(b": ", 1) for line in head_part.split(b"\r\n")[1:])
        length = int(headers.get(b"content-length", b"0"))
        while len(rest) < length:
            piece = await stream.receive_some(65536)
            assert piece, "closed before the body's end"
            rest += piece
        return status, rest


def post_head(extra: str) -> bytes:
    return (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


async def test_a_body_over_the_limit_is_refused_before_it_is_read(
    server: Hosted,
    http: httpx.AsyncClient,
) -> None:
    # Content-Length says so: 413 at once, though no byte of the body was sent.
    status, body = await raw_response(
        server.port, post_head(f"Content-Length: {MAX_REQUEST_BYTES + 1}\r\n")
    )
    assert status == 413
    validate_error(json.loads(body))
    assert json.loads(body)["error"]["code"] == "request_too_large"
    # Chunked: 413 once the chunks pass the limit, though the body never ends (no last chunk).
    chunk = b"x" * 65536
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (MAX_REQUEST_BYTES // len(chunk))
    # The last chunk passes the limit; it goes without its CRLF, so that everything sent is
    # body the server must read (unread bytes at its close could reset the connection).
    chunks.append(b"%x\r\n%s" % (len(chunk), chunk))
    status, body = await raw_response(
        server.port, post_head("Transfer-Encoding: chunked\r\n"), chunks
    )
    assert status == 413
    validate_error(json.loads(body))
    # Just under the limit, the body is read and parsed.
    filler = chat_body(max_tokens=1, user="u" * (MAX_REQUEST_BYTES - 200))
    response = await http.post(CHAT, json=filler)
    assert response.status_code == 200, response.text[:300]
    await assert_still_serving(http)


async def test_long_urls_and_headers_get_the_envelope(
    server: Hosted, http: httpx.AsyncClient
) -> None:
    long_url = await http.get("/v1/models", params={"q": "a" * MAX_URL_BYTES})
    assert_envelope(long_url, 414, None, "uri_too_long")
    big_headers = await http.get("/health", headers={"x-big": "a" * MAX_HEADER_BYTES})
    assert_envelope(big_headers, 431, None, "request_headers_too_large")
    many_headers = await http.get("/health", headers={f"x-h{i}": "a" * 100 for i in range(200)})
    assert_envelope(many_headers, 431, None, "request_headers_too_large")
    # Beyond Hypercorn's own limit h11 refuses it, in the envelope too: once more than
    # HYPERCORN_HEAD_BYTES of a head have arrived and it is still incomplete. (The head
    # never ends here, so that the server reads every byte sent before it answers and closes.)
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nx-big: "
    status, body = await raw_response(server.port, head.ljust(HYPERCORN_HEAD_BYTES + 1, b"a"))
    assert status == 431
    validate_error(json.loads(body))
    assert json.loads(body)["error"]["code"] == "request_headers_too_large"
    # Just under ours: served.
    assert (
        await http.get("/health", headers={"x-big": "a" * (MAX_HEADER_BYTES - 500)})
    ).status_code == 200
    await assert_still_serving(http)


async def test_preparation_runs_off_the_trio_thread(
    server: Hosted, http: httpx.AsyncClient
) -> None:
    """While a request is being prepared (held open here), /health and a stream that already
    runs are served; the held request then completes."""
    hold = server.hold
    hold.entered.clear()
    hold.release.clear()
    async with (
        trio.open_nursery() as nursery,
        http.stream(
            "POST", CHAT, json=chat_body(max_tokens=40, temperature=0, stream=True)
        ) as stream,
    ):
        lines = stream.aiter_lines()
        assert (await anext(lines)).startswith("data: ")  # the stream is running
        held: list[httpx.Response] = []

        async def held_request() -> None:
            held.append(await http.post(CHAT, json=chat_body(max_tokens=2, user="hold")))

        nursery.start_soon(held_request)
        assert await trio.to_thread.run_sync(hold.entered.wait, 60)
        assert hold.thread is not None and hold.thread != server.trio_thread
        health = await http.get("/health")
        assert health.status_code == 200
        rest = [line async for line in lines]
        assert "data: [DONE]" in rest  # the running stream went on to its end
        hold.release.set()
    assert held[0].status_code == 200, held[0].text
    await assert_still_serving(http)


async def test_a_request_abandoned_while_prepared_frees_the_slot(
    server: Hosted,
    http: httpx.AsyncClient,
) -> None:
    hold = server.hold
    hold.entered.clear()
    hold.release.clear()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(http.post, CHAT, json=chat_body(max_tokens=2, user="hold")))
            assert await trio.to_thread.run_sync(hold.entered.wait, 60)
            scope.cancel()  # the client leaves while its request is being prepared
    hold.release.set()  # the abandoned thread ends; the next preparation gets the slot
    with trio.fail_after(60):
        await assert_still_serving(http)


def _named_events(raw: str) -> list[dict[str, Any]]:
    assert raw.endswith("\n\n")
    events = []
    for block in raw.split("\n\n")[:-1]:
        kind, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


async def test_a_failure_while_streaming_ends_with_an_error_event(
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Injected failures in rendering (chat, completions, Responses): the stream still ends with
    one final error event in the envelope, logged with the request id and without the prompt."""
    secret = "PROMPT-TEXT-NEVER-LOGGED"

    def fail(*_: Any, **__: Any) -> Any:
        raise RuntimeError(secret)

    caplog.set_level(logging.ERROR, logger="mlx_nursery.http")
    with monkeypatch.context() as patch:
        patch.setattr(Prepared, "delta_json", fail)
        patch.setattr(ResponseBuilder, "text", fail)
        for path, body in [
            # Greedy: the tiny model then always writes text (sampled, it could draw EOS first).
            (CHAT, chat_body(secret, max_tokens=4, stream=True, temperature=0)),
            (
                COMPLETIONS,
                {
                    "model": "tiny",
                    "prompt": secret,
                    "max_tokens": 4,
                    "stream": True,
                    "temperature": 0,
                },
            ),
        ]:
            async with http.stream("POST", path, json=body) as response:
                events = await sse_events(response)
                request_id = response.headers["x-request-id"]
            assert events[-1] != "[DONE]" and "[DONE]" not in events
            validate_error(events[-1])
            assert events[-1]["error"]["code"] == "internal_error"
            assert request_id in events[-1]["error"]["message"]
            assert all("error" not in event for event in events[:-1])
            assert any(request_id in r.getMessage() for r in caplog.records)
        async with http.stream(
            "POST",
            RESPONSES,
            json={
                "model": "tiny",
                "input": secret,
                "max_output_tokens": 4,
                "stream": True,
                "temperature": 0,
            },
        ) as response:
            events = _named_events((await response.aread()).decode())
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "error",
            "response.failed",
        ]
        validate(events[-2], "ResponseErrorEvent")
        assert events[-2]["code"] == "internal_error"
        validate(events[-1], "ResponseFailedEvent")
        assert events[-1]["response"]["status"] == "failed"
        assert secret not in json.dumps(events[-1])
    assert caplog.records and all(secret not in r.getMessage() for r in caplog.records)
    await assert_still_serving(http)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v1//chat/completions", 404),  # werkzeug would redirect (308) with an HTML body
        ("POST", "/v1/chat/completions/", 404),
        ("DELETE", "/v1/completions", 405),
        ("POST", "/v1/nothing", 404),
    ],
)
async def test_unrouted_requests_get_the_envelope_and_keep_the_connection(
    server: Hosted, method: str, path: str, status: int
) -> None:
    """Answered before the route reads the body: the body is read all the same, so that the
    keep-alive connection serves the next request (one connection: the pool's limit is 1)."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60, limits=limits) as http:
        for _ in range(3):
            response = await http.request(
                method, path, json=chat_body(max_tokens=1, padding="x" * 60_000)
            )
            assert_envelope(response, status, None)
            await assert_still_serving(http)


async def test_null_format_fields_are_not_echoed(http: httpx.AsyncClient) -> None:
    form = {
        "type": "json_schema",
        "name": "o",
        "description": None,
        "strict": None,
        "schema": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    response = await http.post(
        "/v1/responses",
        json={"model": "tiny", "input": "hi", "max_output_tokens": 3, "text": {"format": form}},
    )
    assert response.status_code == 200, response.text
    validate(response.json(), "Response")
    assert response.json()["text"]["format"] == {k: v for k, v in form.items() if v is not None}
