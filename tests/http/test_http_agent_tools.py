"""Tools as agent clients use them: strict tools under tool_choice "auto" (enforced lazily),
the fallback tool format for models whose template has none, and real agent SDKs.

The random tiny model is made to open a call with a forced prefix (`scripted(then_free=True)`);
what follows is the model's own choice, constrained only by the server's grammar.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import pytest

from mlx_nursery.generation._tools import FALLBACK_TOOLS_PROMPT
from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    engine_of,
    running_server,
    scripted,
    sdk,
    server_thread,
    validate,
)

PLAN = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "description": "Plan a trip",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome", "Oslo"]},
                "days": {"enum": [1, 2, 3]},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
NOTE = {"type": "function", "function": {"name": "take_note", "parameters": {"type": "object"}}}
OPENS_A_CALL = {"opens": "Sure.<tool_call>\n"}


@pytest.fixture(scope="module")
def opens_a_call(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model, made to open a call (then free) for the user `opens`."""
    processors = scripted(OPENS_A_CALL, tiny_model, then_free=True)
    with server_thread(tiny_model, extra_processors=processors) as served:
        yield served


def assert_strict_call(name: str, arguments: str) -> None:
    assert name in ("plan_trip", "take_note")
    if name == "plan_trip":
        jsonschema.validate(json.loads(arguments), PLAN["function"]["parameters"])


@pytest.mark.parametrize("stream", [False, True])
async def test_strict_tools_under_auto_are_enforced_once_a_call_opens(
    opens_a_call: ThreadedServer, stream: bool
) -> None:
    async with borrowed(opens_a_call) as server:
        client = sdk(server)
        fields: dict[str, Any] = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "trip?"}],
            "tools": [PLAN, NOTE],
            "max_tokens": 160,
            "temperature": 1.0,
            "user": "opens",
        }
        calls = []
        for seed in range(3):
            if stream:
                chunks = [
                    c
                    async for c in await client.chat.completions.create(
                        **fields, seed=seed, stream=True
                    )
                ]
                deltas = [
                    d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []
                ]
                names = [d.function.name for d in deltas if d.function and d.function.name]
                arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
                calls.append((names[0], arguments))
            else:
                reply = await client.chat.completions.create(**fields, seed=seed)
                (call, *_) = reply.choices[0].message.tool_calls or []
                calls.append((call.function.name, call.function.arguments))
        free = await client.chat.completions.create(
            **{**fields, "user": None, "max_tokens": 8, "seed": 0}  # seeded: never flaky
        )
    for name, arguments in calls:
        assert_strict_call(name, arguments)
    assert free.choices[0].message.content  # no call opened: text, unconstrained


async def test_strict_tools_under_auto_in_responses(opens_a_call: ThreadedServer) -> None:
    tools = [{"type": "function", **PLAN["function"]}, {"type": "function", **NOTE["function"]}]
    async with borrowed(opens_a_call) as server:
        client = sdk(server)
        response = await client.responses.create(
            model="tiny",
            input="trip?",
            tools=tools,
            user="opens",
            max_output_tokens=160,
            temperature=1.0,
        )
    body = response.model_dump(exclude_unset=True, mode="json", warnings=False)
    validate(body, "Response")
    calls = [item for item in body["output"] if item["type"] == "function_call"]
    assert calls
    for call in calls:
        assert_strict_call(call["name"], call["arguments"])
    assert [t["strict"] for t in body["tools"]] == [True, False]


async def test_the_sdks_pydantic_strict_tool_is_accepted(tiny_model: Path) -> None:
    import openai
    import pydantic

    class Lookup(pydantic.BaseModel):
        city: str

    async with running_server(tiny_model) as server:
        reply = await sdk(server).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            tools=[openai.pydantic_function_tool(Lookup)],
        )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.fixture(scope="module")
def toolless_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a plain ChatML template that knows nothing of tools."""
    path = tmp_path_factory.mktemp("toolless") / "tiny-toolless"
    shutil.copytree(tiny_model, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for message in messages %}<|im_start|>{{ message.role }}\n"
        "{{ message.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


async def test_a_model_without_a_tool_format_gets_the_fallback(toolless_model: Path) -> None:
    # Compact JSON: strict tools' arguments are constrained to it (as forced calls are).
    call = '<tool_call>\n{"name":"plan_trip","arguments":{"city":"Rome","days":2}}\n</tool_call>'
    processors = scripted({"call": "Let me plan." + call}, toolless_model)
    async with (
        running_server(toolless_model, extra_processors=processors) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        tokenizer = engine_of(server).model.tokenizer
        assert not tokenizer.has_tool_calling
        scripted_reply = (
            await http.post(
                "/v1/chat/completions",
                json=chat_body("trip?", tools=[PLAN], user="call", max_tokens=80, temperature=0),
            )
        ).json()
        forced = (
            await http.post(
                "/v1/chat/completions",
                json=chat_body(
                    "trip?",
                    tools=[PLAN, NOTE],
                    tool_choice="required",
                    max_tokens=120,
                    temperature=1.0,
                    seed=4,
                ),
            )
        ).json()
        history = [
            {"role": "user", "content": "trip?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "plan_trip",
                            "arguments": '{"city": "Oslo", "days": 1}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "booked"},
        ]
        round_trip = await http.post(
            "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": history,
                "tools": [PLAN],
                "max_tokens": 4,
                "logprobs": False,
            },
        )
        prompt = await http.post(
            "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1}
        )
        stream = await sdk(server).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "trip?"}],
            tools=[PLAN],
            user="call",
            max_tokens=80,
            temperature=0,
            stream=True,
        )
        chunks = [c async for c in stream]
    assert prompt.status_code == 200
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas if d.function and d.function.name] == ["plan_trip"]
    assert json.loads("".join(d.function.arguments or "" for d in deltas if d.function)) == {
        "city": "Rome",
        "days": 2,
    }
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    choice = scripted_reply["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("tool_calls", "Let me plan.")
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in choice["message"]["tool_calls"]
    ] == [("plan_trip", {"city": "Rome", "days": 2})]
    (forced_call,) = forced["choices"][0]["message"]["tool_calls"]
    assert_strict_call(forced_call["function"]["name"], forced_call["function"]["arguments"])
    assert round_trip.status_code == 200, round_trip.text
    assert round_trip.json()["usage"]["prompt_tokens"] > 0


def test_the_fallback_renders_tools_calls_and_results_as_documented(toolless_model: Path) -> None:
    from transformers import AutoTokenizer

    from mlx_nursery.generation._converter import structure
    from mlx_nursery.generation._prompts import render_chat
    from mlx_nursery.generation._request_parts import ChatMessage
    from mlx_nursery.generation._tools import normalize_tools

    tokenizer = AutoTokenizer.from_pretrained(str(toolless_model))
    messages = [
        structure(m, ChatMessage)
        for m in [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "trip?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "plan_trip", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "booked"},
        ]
    ]
    tools = normalize_tools([PLAN])
    text = tokenizer.decode(render_chat(tokenizer, messages, tools, native_tools=False))
    described = FALLBACK_TOOLS_PROMPT.format(tools=json.dumps(tools[0]))
    assert f"<|im_start|>system\nBe brief.\n\n{described}<|im_end|>" in text
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "plan_trip", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    )
    assert "<|im_start|>user\n<tool_response>\nbooked\n</tool_response><|im_end|>" in text


@pytest.fixture(scope="module")
def agents_users(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model, made to open a call for the user `opens`, to say a line for `says`."""
    opens = scripted(OPENS_A_CALL, tiny_model, then_free=True)
    says = scripted({"says": "Rome it is."}, tiny_model)

    def processors(body: Any) -> tuple[Any, ...]:
        return opens(body) + says(body)

    with server_thread(tiny_model, extra_processors=processors) as served:
        yield served


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_openai_agents_turn_with_a_default_function_tool(
    agents_users: ThreadedServer, api: str
) -> None:
    """openai-agents (asyncio, so in its own thread) with a default `@function_tool` (strict)
    and tool_choice left alone: the requests are accepted, the model's call is well formed
    (the forced prefix only opens it) and the SDK runs the tool; a text reply is the output."""
    import asyncio

    import trio
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    ran: list[tuple[str, int]] = []

    @function_tool  # enums keep a random model's arguments short: the call fits its budget
    def plan_trip(city: Literal["Paris", "Rome", "Oslo"], days: Literal[1, 2, 3]) -> str:
        """Plan a trip."""
        ran.append((city, days))
        return f"{days} days in {city}"

    def run_agent(base_url: str, user: str) -> Any:
        async def main() -> Any:
            client = AsyncOpenAI(base_url=base_url + "/v1", api_key="unused")
            model_class = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
            agent = Agent(
                name="planner",
                instructions="Plan trips.",
                tools=[plan_trip],
                model=model_class(model="tiny", openai_client=client),
                # One call, then the turn ends: a random model would ramble on to
                # max_tokens, which the SDK takes for a failure (as with OpenAI).
                model_settings=ModelSettings(
                    max_tokens=120,
                    temperature=1.0,
                    parallel_tool_calls=False,
                    extra_args={"user": user},
                ),
                tool_use_behavior="stop_on_first_tool",
            )
            try:
                return (await Runner.run(agent, "Plan a trip to Rome.", max_turns=2)).final_output
            finally:
                await client.close()

        return asyncio.run(main())

    async with borrowed(agents_users) as server:
        called = await trio.to_thread.run_sync(run_agent, server.base_url, "opens")
        text = await trio.to_thread.run_sync(run_agent, server.base_url, "says")
    assert len(ran) == 1, (called, text)
    assert called == f"{ran[0][1]} days in {ran[0][0]}"
    assert text == "Rome it is."
