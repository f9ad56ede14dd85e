"""Structured outputs: the random tiny model writes noise, constrained it writes valid JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
import trio
from pydantic import BaseModel, Field

from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    sdk,
    server_thread,
    sse_events,
    validate,
    validate_error,
)

NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {
                "ok": {"type": "boolean"},
                "score": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["ok", "score"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "kind", "tags", "owner"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": NESTED, "strict": True}}


@pytest.fixture(scope="module")
def plain(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model served with the defaults: every test here needs no other settings."""
    with server_thread(tiny_model) as served:
        yield served


async def test_fifty_random_generations_all_validate(plain: ThreadedServer) -> None:
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=120) as http,
    ):
        replies: list[dict[str, Any]] = []

        async def one(seed: int, constrained: bool) -> None:
            # Room for the constrained object to end; a few tokens of the unconstrained
            # noise are enough to show that it is none.
            extra = {"response_format": FORMAT, "max_tokens": 200} if constrained else {}
            body = chat_body(
                "Describe a pet.", temperature=1.0, seed=seed, **{"max_tokens": 16, **extra}
            )
            replies.append(
                {
                    "constrained": constrained,
                    **(await http.post("/v1/chat/completions", json=body)).json(),
                }
            )

        async with trio.open_nursery() as nursery:
            for seed in range(50):
                nursery.start_soon(one, seed, True)
            for seed in range(5):
                nursery.start_soon(one, seed, False)
    constrained = [r for r in replies if r["constrained"]]
    assert len(constrained) == 50
    for reply in constrained:
        validate(
            {k: v for k, v in reply.items() if k != "constrained"}, "CreateChatCompletionResponse"
        )
        assert reply["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(reply["choices"][0]["message"]["content"]), NESTED)
    assert len({r["choices"][0]["message"]["content"] for r in constrained}) > 10
    # The same model, unconstrained: noise.
    for reply in (r for r in replies if not r["constrained"]):
        with pytest.raises(ValueError):
            json.loads(reply["choices"][0]["message"]["content"])


class Owner(BaseModel):
    ok: bool
    score: int = Field(ge=0, le=9)


class Pet(BaseModel):
    name: str = Field(max_length=6)
    kind: Literal["cat", "dog"]
    owner: Owner


async def test_sdk_parse_round_trips_for_chat_and_responses(plain: ThreadedServer) -> None:
    async with borrowed(plain) as server:
        client = sdk(server)
        chat = await client.chat.completions.parse(
            model="tiny",
            messages=[{"role": "user", "content": "A pet?"}],
            response_format=Pet,
            max_tokens=120,
            temperature=1.0,
            seed=4,
        )
        parsed = chat.choices[0].message.parsed
        assert isinstance(parsed, Pet) and parsed.kind in ("cat", "dog")
        response = await client.responses.parse(
            model="tiny", input="A pet?", text_format=Pet, max_output_tokens=120, temperature=1.0
        )
        assert isinstance(response.output_parsed, Pet)
        validate(
            response.model_dump(exclude_unset=True, by_alias=True, mode="json", warnings=False),
            "Response",
        )


async def test_streaming_json_object_and_length_is_reported_as_length(
    plain: ThreadedServer,
) -> None:
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        body = chat_body(
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": NESTED}},
            temperature=1.0,
            seed=9,
            max_tokens=200,
            stream=True,
        )
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            events = (await sse_events(response))[:-1]
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        jsonschema.validate(json.loads(text), NESTED)
        short = (
            await http.post(
                "/v1/chat/completions",
                json=chat_body(
                    response_format={"type": "json_object"}, max_tokens=3, temperature=1.0, seed=2
                ),
            )
        ).json()
        assert short["choices"][0]["finish_reason"] == "length"
        with pytest.raises(openai.LengthFinishReasonError):
            await sdk(server).chat.completions.parse(
                model="tiny",
                messages=[{"role": "user", "content": "A pet?"}],
                response_format=Pet,
                max_tokens=3,
            )
        ok = await http.post("/v1/chat/completions", json=chat_body(max_tokens=2))
        assert ok.status_code == 200


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["CET", "UTC"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
    ids=["required", "named"],
)
async def test_forced_tool_choice_always_yields_a_valid_call(
    plain: ThreadedServer, choice: Any
) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    async with borrowed(plain) as server:
        client = sdk(server)
        for seed in range(8):
            reply = await client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Use a tool."}],
                tools=TOOLS,
                tool_choice=choice,
                temperature=1.0,
                seed=seed,
                max_tokens=120,
            )
            validate(reply.model_dump(exclude_unset=True), "CreateChatCompletionResponse")
            assert reply.choices[0].finish_reason == "tool_calls"
            assert reply.choices[0].message.content is None  # as OpenAI's, and the auto path's
            (call,) = reply.choices[0].message.tool_calls
            if isinstance(choice, dict):
                assert call.function.name == "get_time"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        # Streamed, the first delta names the role with content null (OpenAI's for a call),
        # where a free answer opens with content "".
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
            firsts = []
            for forced in (True, False):
                body = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "Use a tool."}],
                    "tools": TOOLS,
                    "max_tokens": 120,
                    "stream": True,
                    **({"tool_choice": choice} if forced else {}),
                }
                async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
                    lines = [
                        line async for line in reply.aiter_lines() if line.startswith("data: {")
                    ]
                firsts.append(json.loads(lines[0][len("data: ") :])["choices"][0]["delta"])
                if forced:
                    kinds = {
                        k for line in lines for k in json.loads(line[6:])["choices"][0]["delta"]
                    }
                    assert "tool_calls" in kinds
            assert firsts == [
                {"role": "assistant", "content": None, "refusal": None},
                {"role": "assistant", "content": "", "refusal": None},
            ]
        # The SDK's stream helper assembles the call from those deltas.
        async with client.chat.completions.stream(
            model="tiny",
            messages=[{"role": "user", "content": "Use a tool."}],
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=120,
        ) as stream:
            final = await stream.get_final_completion()
        assert final.choices[0].message.content is None
        (streamed,) = final.choices[0].message.tool_calls or []
        function = streamed.function
        jsonschema.validate(json.loads(function.arguments), schemas[function.name])
        # And through the Responses API, with its flat tool form.
        flat = [{"type": "function", **t["function"]} for t in TOOLS]
        response = await client.responses.create(
            model="tiny",
            input="Use a tool.",
            tools=flat,
            tool_choice="required",
            max_output_tokens=120,
        )
        (call_item,) = [item for item in response.output if item.type == "function_call"]
        jsonschema.validate(json.loads(call_item.arguments), schemas[call_item.name])


async def test_a_grammar_too_complex_to_follow_is_the_requests_error(
    plain: ThreadedServer,
) -> None:
    """llguidance gives up on some schemas only while decoding (1000 optional properties pass
    validation, then exceed its parser's limits at the first token): a 400 naming the format,
    in-stream for a stream, never a 500; the server goes on."""
    schema = {
        "type": "object",
        "properties": {str(i): {"type": "string"} for i in range(1000)},
        "additionalProperties": False,
    }
    fields = {
        "max_tokens": 8,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "wide", "schema": schema},
        },
    }
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        refused = await http.post("/v1/chat/completions", json=chat_body(**fields))
        async with http.stream(
            "POST", "/v1/chat/completions", json=chat_body(stream=True, **fields)
        ) as response:
            events = await sse_events(response)
        health = await http.get("/health")
    assert refused.status_code == 400
    validate_error(refused.json())
    assert refused.json()["error"]["param"] == "response_format.json_schema.schema"
    assert len(refused.json()["error"]["message"]) < 1000
    assert events[-1]["error"]["type"] == "invalid_request_error"
    assert events[-1]["error"]["code"] == "constraint_failed"
    assert health.status_code == 200
