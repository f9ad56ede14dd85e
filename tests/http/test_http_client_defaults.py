"""What agent clients send by default gets a defined answer: hints this server cannot act on
are accepted and named in `x-ignored-params` (a 400 with --strict-params); what is cheap and
real is done (`truncation: "auto"`, `max_tool_calls`, `include: reasoning.encrypted_content`);
what would change the answer and is not implemented stays a 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.http.test_http_tools import SCRIPTS, TIME, WEATHER
from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    running_server,
    scripted,
    sdk,
    server_thread,
    validate,
    validate_error,
)

CHAT_HINTS = {
    "reasoning_effort": "low",
    "verbosity": "low",
    "prompt_cache_retention": "24h",
    "store": True,
    "metadata": {"run": "7"},
}


@pytest.fixture(scope="module")
def plain(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model served with the defaults, for the tests that need no other settings."""
    with server_thread(tiny_model) as served:
        yield served


async def test_chat_hints_are_accepted_and_named(plain: ThreadedServer) -> None:
    async with borrowed(plain) as server:
        client = sdk(server)
        raw = await client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, **CHAT_HINTS
        )
        plain = await client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, store=False
        )
        streamed = await client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            reasoning_effort="high",
        )
        chunks = [c async for c in streamed.parse()]  # type: ignore[attr-defined]
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2
            )
    completion = raw.parse()
    validate(completion.model_dump(exclude_unset=True), "CreateChatCompletionResponse")
    assert raw.headers["x-ignored-params"].split(", ") == list(CHAT_HINTS)
    assert "x-ignored-params" not in plain.headers  # store: false is what this server does anyway
    assert streamed.headers["x-ignored-params"] == "reasoning_effort"
    assert chunks[-1].choices[0].finish_reason is not None
    assert refused.value.body["param"] == "n"  # type: ignore[index]


# Every optional field of the SDKs' create calls (openai 3.57, anthropic 0.7x): a client that
# sends them all, unset ones as null, must be served, and one set to what this server cannot
# act on gets it named in x-ignored-params.
SDK_FIELDS = {
    "/v1/chat/completions": (
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "audio frequency_penalty function_call functions logit_bias logprobs max_completion_tokens"
        " metadata modalities moderation n parallel_tool_calls prediction presence_penalty"
        " prompt_cache_key prompt_cache_options prompt_cache_retention reasoning_effort"
        " response_format safety_identifier seed service_tier stop store stream_options"
        " temperature tool_choice tools top_logprobs top_p user verbosity web_search_options",
        {"moderation": {"enabled": True}, "prompt_cache_options": {"ttl": "1h"}},
    ),
    "/v1/responses": (
        {"input": "hi", "max_output_tokens": 2},
        "access_programs background background_options context_management conversation include"
        " instructions max_tool_calls metadata moderation parallel_tool_calls"
        " previous_response_id prompt prompt_cache_key prompt_cache_options"
        " prompt_cache_retention reasoning safety_identifier service_tier store stream_options"
        " temperature text tool_choice tools top_logprobs top_p truncation user image",
        {"context_management": [{"type": "compaction"}], "access_programs": ["x"]},
    ),
    "/v1/messages": (
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "container context_management inference_geo metadata output_config service_tier"
        " stop_sequences system temperature thinking tool_choice tools top_k top_p"
        " user_profile_id workspace_id",
        {"user_profile_id": "u1", "workspace_id": "w1"},
    ),
}


@pytest.mark.parametrize("path", list(SDK_FIELDS))
async def test_every_sdk_field_is_taken_as_null_and_unused_ones_are_named(
    plain: ThreadedServer, path: str
) -> None:
    base, names, hinted = SDK_FIELDS[path]
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        nulls = {name: None for name in names.split()}
        served = await http.post(path, json={"model": "tiny", **base, **nulls})
        assert served.status_code == 200, served.text
        assert "x-ignored-params" not in served.headers
        named = await http.post(path, json={"model": "tiny", **base, **hinted})
        assert named.status_code == 200, named.text
        assert sorted(named.headers["x-ignored-params"].split(", ")) == sorted(hinted)


async def test_strict_params_refuses_the_hints(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, strict_params=True) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        for field, value in CHAT_HINTS.items():
            response = await http.post(
                "/v1/chat/completions", json=chat_body("hi", max_tokens=2, **{field: value})
            )
            assert response.status_code == 400, field
            validate_error(response.json())
            assert response.json()["error"]["param"] == field
        response = await http.post(
            "/v1/responses", json={"model": "tiny", "input": "hi", "text": {"verbosity": "low"}}
        )
        assert response.status_code == 400 and response.json()["error"]["param"] == "text.verbosity"


async def test_responses_defaults_of_agent_clients(plain: ThreadedServer) -> None:
    """A Codex-style request: store false, encrypted reasoning asked for, auto truncation,
    a tool-call cap, a cache retention, obfuscation and a reasoning effort."""
    async with borrowed(plain) as server:
        client = sdk(server)
        fields = {
            "model": "tiny",
            "input": "hi",
            "max_output_tokens": 4,
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "truncation": "auto",
            "max_tool_calls": 3,
            "prompt_cache_retention": "in-memory",
            "reasoning": {"effort": "low"},
            "text": {"verbosity": "low"},
        }
        raw = await client.responses.with_raw_response.create(**fields)
        streamed = await client.responses.with_raw_response.create(
            **fields, stream=True, stream_options={"include_obfuscation": True}
        )
        events = [e async for e in streamed.parse()]  # type: ignore[attr-defined]
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(**fields, background=True)  # store: false
    response = raw.parse()
    body = response.model_dump(exclude_unset=True, mode="json", warnings=False)
    validate(body, "Response")
    assert (body["truncation"], body["max_tool_calls"]) == ("auto", 3)
    assert not [item for item in body["output"] if item["type"] == "reasoning"]
    assert raw.headers["x-ignored-params"].split(", ") == [
        "prompt_cache_retention",
        "reasoning",
        "text.verbosity",
    ]
    assert streamed.headers["x-ignored-params"].split(", ") == [
        "prompt_cache_retention",
        "reasoning",
        "text.verbosity",
        "stream_options.include_obfuscation",
    ]
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert refused.value.body["param"] == "background"  # type: ignore[index]


async def test_auto_truncation_drops_the_oldest_turns_to_fit(plain: ThreadedServer) -> None:
    turns = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"turn {i}: " + " ".join(f"word{i}x{j}" for j in range(400)),
        }
        for i in range(13)
    ]
    request = {
        "model": "tiny",
        "input": turns,
        "instructions": "Be brief.",
        "max_output_tokens": 8,
        "temperature": 0,
    }
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        refused = await http.post("/v1/responses", json=request)
        truncated = await http.post("/v1/responses", json={**request, "truncation": "auto"})
        short = await http.post(
            "/v1/responses", json={**request, "input": turns[-1:], "truncation": "auto"}
        )
        dropped = int(truncated.headers["x-truncated-messages"])
        # One turn fewer dropped would not fit: only as many turns as needed went.
        one_more_turn = await http.post(
            "/v1/responses", json={**request, "input": turns[dropped - 2 :]}
        )
    assert (
        refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    )
    assert truncated.status_code == 200, truncated.text
    assert 0 < dropped < len(turns) and turns[dropped]["role"] == "user"  # the rest starts a turn
    assert truncated.json()["usage"]["input_tokens"] + 8 <= 4096
    assert (
        one_more_turn.status_code == 400
        and one_more_turn.json()["error"]["code"] == "context_length_exceeded"
    )
    assert short.status_code == 200 and "x-truncated-messages" not in short.headers


async def test_max_tool_calls_caps_the_calls(tiny_model: Path) -> None:
    tools = [{"type": "function", **WEATHER["function"]}, {"type": "function", **TIME["function"]}]
    async with running_server(tiny_model, extra_processors=scripted(SCRIPTS, tiny_model)) as server:
        client = sdk(server)
        both = await client.responses.create(
            model="tiny", input="go", user="two", tools=tools, temperature=0, max_output_tokens=80
        )
        capped = await client.responses.create(
            model="tiny",
            input="go",
            user="two",
            tools=tools,
            temperature=0,
            max_output_tokens=80,
            max_tool_calls=1,
        )
    assert [i.name for i in both.output if i.type == "function_call"] == ["get_weather", "get_time"]
    assert [i.name for i in capped.output if i.type == "function_call"] == ["get_weather"]
