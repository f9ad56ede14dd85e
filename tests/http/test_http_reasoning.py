"""Thinking models over HTTP: reasoning apart from the answer (chat and Responses, streamed or
not), thinking switched by the effort, stop strings, grammars and tool calls on the answer.

The `tiny-thinking` presets are the tiny model with `<think>` / `</think>` tokens and a
Qwen3-style template: in `tiny-thinking` the model opens its thinking itself, in
`tiny-thinking-open` the template opens it in the prompt. With random weights the model never
writes a marker by itself; a forced token script (`scripted`) does, through the real engine,
detokenizer and streams.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from transformers import AutoTokenizer

from mlx_nursery.tools import make_model
from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    engine_of,
    eventually,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
    scripted,
    sdk,
    server_thread,
    sse_events,
    validate,
    validate_error,
)

THOUGHT = "<think>\nI ponder.\n</think>"
SCRIPTS = {"think": THOUGHT + "\n\nHello there", "mid": "I ponder.\n</think>\n\nHello there"}
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["kind", "age"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 8}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def thinking_users(thinking_model: Path) -> Iterator[ThreadedServer]:
    """The thinking model, its output dictated for the users `SCRIPTS` names."""
    with server_thread(
        thinking_model, extra_processors=scripted(SCRIPTS, thinking_model)
    ) as served:
        yield served


@pytest.fixture(scope="module")
def open_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "open", "tiny-thinking-open")


@functools.cache
def tokenizer_of(model: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(model))


def token_count(model: Path, text: str) -> int:
    return len(tokenizer_of(model).encode(text, add_special_tokens=False))


async def test_chat_separates_the_reasoning_streamed_or_not(
    thinking_model: Path, thinking_users: ThreadedServer
) -> None:
    async with borrowed(thinking_users) as server:
        client = sdk(server)
        fields: dict[str, Any] = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "user": "think",
            "max_tokens": 40,
            "temperature": 0,
        }
        reply = await client.chat.completions.create(**fields, logprobs=True)
        stream = await client.chat.completions.create(
            **fields, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        stopped = await client.chat.completions.create(**fields, stop=["ponder", "there"])
    validate(reply.model_dump(exclude_unset=True), "CreateChatCompletionResponse")
    message = reply.choices[0].message
    assert (message.content, message.reasoning_content) == ("Hello there", "I ponder.")  # type: ignore[attr-defined]
    assert reply.choices[0].finish_reason == "stop"
    thought_tokens = token_count(thinking_model, THOUGHT)
    usage = reply.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == thought_tokens
    assert usage.completion_tokens > thought_tokens
    # Logprobs are the answer's tokens: together, exactly the content.
    assert reply.choices[0].logprobs is not None
    assert "".join(e.token for e in reply.choices[0].logprobs.content or []) == "Hello there"
    # Streamed: every piece of reasoning before any content, no marker anywhere, the same text.
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    kinds = [
        "reasoning" if getattr(d, "reasoning_content", None) else "content"
        for d in deltas
        if getattr(d, "reasoning_content", None) or d.content
    ]
    assert kinds == sorted(kinds, key=lambda kind: kind != "reasoning") and "content" in kinds
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "I ponder."
    assert "".join(d.content or "" for d in deltas) == "Hello there"
    final = chunks[-1].usage
    assert final is not None and final.completion_tokens_details is not None
    assert final.completion_tokens_details.reasoning_tokens == thought_tokens
    # A stop string is matched on the answer only: the reasoning's "ponder" stops nothing.
    held = stopped.choices[0].message
    assert (held.content, held.reasoning_content) == ("Hello ", "I ponder.")  # type: ignore[attr-defined]


async def test_an_output_that_begins_mid_thought(open_model: Path) -> None:
    """The template opens `<think>` in the prompt: the output is reasoning until `</think>`,
    and thinking cut by the token budget is all reasoning, with no content."""
    processors = scripted(SCRIPTS, open_model)
    no_end = {"2047": -100}  # `</think>`: the random model may not close its thinking
    async with (
        running_server(open_model, extra_processors=processors, max_concurrency=1) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        # A client that leaves mid-thought stops the compute; the lane comes back.
        long = chat_body("hi", max_tokens=3000, stream=True, logit_bias={**no_end, "317": 50})
        connection = await raw_http(port_of(server), post_request("/v1/chat/completions", long))
        await read_until(connection, b"reasoning_content")
        await connection.aclose()
        await eventually(lambda: engine_of(server).statistics().lanes_borrowed == 0, "lane back")
        worker = engine_of(server).statistics().worker
        assert worker is not None and worker.generated_tokens < 1500
        closed = await http.post(
            "/v1/chat/completions", json=chat_body("hi", user="mid", max_tokens=40, temperature=0)
        )
        cut = await http.post(  # "I", " p", "on" of the script, then the budget is spent
            "/v1/chat/completions", json=chat_body("hi", user="mid", max_tokens=3, temperature=0)
        )
        async with http.stream(
            "POST",
            "/v1/chat/completions",
            json=chat_body("hi", user="mid", max_tokens=3, temperature=0, stream=True),
        ) as streamed:
            events = await sse_events(streamed)
        # With a format asked for, the thinking may not end the sequence: its answer is due.
        ends = {str(eos): 100 for eos in (0, 2)}  # `<|endoftext|>`, `<|im_end|>`
        json_format = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
        held = await http.post(  # thinking " p" (favoured), which the format would refuse
            "/v1/chat/completions",
            json=chat_body(
                "hi",
                max_tokens=6,
                temperature=0,
                logit_bias={**no_end, **ends, "317": 50},
                response_format=json_format,
            ),
        )
        free = await http.post(
            "/v1/chat/completions",
            json=chat_body("hi", max_tokens=6, temperature=0, logit_bias={**no_end, **ends}),
        )
    tokenizer = tokenizer_of(open_model)
    assert tokenizer.convert_tokens_to_ids(["</think>", "<|endoftext|>", "<|im_end|>"]) == [
        2047,
        0,
        2,
    ]
    assert tokenizer.decode([317]) == " p"
    assert free.json()["choices"][0]["finish_reason"] == "stop"  # the bias is EOS at once
    assert held.json()["choices"][0]["finish_reason"] == "length"
    assert held.json()["choices"][0]["message"]["reasoning_content"] == "p" + " p" * 5
    assert held.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6
    message = closed.json()["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("Hello there", "I ponder.")
    body = cut.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"] == ""
    assert body["choices"][0]["message"]["reasoning_content"] == "I pon"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert not "".join(d.get("content", "") for d in deltas)
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "I pon"


async def test_the_effort_turns_thinking_on_or_off(thinking_model: Path, open_model: Path) -> None:
    async with (
        running_server(
            None, model=[f"{thinking_model}=tiny", f"{open_model}=open"], max_loaded_models=2
        ) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):

        async def prompt_tokens(model: str, **fields: Any) -> int:
            body = chat_body("hi", model=model, max_tokens=1, temperature=0, **fields)
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            assert "x-ignored-params" not in response.headers
            return int(response.json()["usage"]["prompt_tokens"])

        closed_block = token_count(thinking_model, "<think>\n\n</think>\n\n")
        opened_block = token_count(thinking_model, "<think>\n")
        base = await prompt_tokens("tiny")
        assert await prompt_tokens("tiny", reasoning_effort="high") == base
        assert await prompt_tokens("tiny", reasoning_effort="none") == base + closed_block
        assert await prompt_tokens("open") == base + opened_block
        assert await prompt_tokens("open", reasoning_effort="none") == base + closed_block
        # vLLM's chat_template_kwargs switch it too, and /tokenize counts the same prompt.
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        assert await prompt_tokens("tiny", **off) == base + closed_block
        assert await prompt_tokens("open", **off, reasoning_effort="none") == base + closed_block
        counted = await http.post("/tokenize", json=chat_body("hi", model="tiny", **off))
        assert counted.json()["count"] == base + closed_block
        disagree = chat_body("hi", model="tiny", reasoning_effort="high", **off)
        refused = await http.post("/v1/chat/completions", json=disagree)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "chat_template_kwargs.enable_thinking"
        response = await http.post(
            "/v1/responses",
            json={
                "model": "tiny",
                "input": "hi",
                "max_output_tokens": 1,
                "reasoning": {"effort": "none"},
            },
        )
        assert response.json()["usage"]["input_tokens"] == base + closed_block
        assert response.json()["reasoning"]["effort"] == "none"
        summary = await http.post(
            "/v1/responses",
            json={
                "model": "tiny",
                "input": "hi",
                "max_output_tokens": 1,
                "reasoning": {"summary": "auto"},
            },
        )
        assert summary.headers["x-ignored-params"] == "reasoning.summary"  # none is made
        for path, body, param in [
            ("/v1/chat/completions", chat_body("hi", reasoning_effort="lots"), "reasoning_effort"),
            (
                "/v1/responses",
                {"model": "tiny", "input": "hi", "reasoning": {"effort": 3}},
                "reasoning.effort",
            ),
        ]:
            refused = await http.post(path, json=body)
            assert refused.status_code == 400
            validate_error(refused.json())
            assert refused.json()["error"]["param"] == param


async def test_responses_give_a_reasoning_item_streamed_or_not(
    thinking_model: Path, thinking_users: ThreadedServer
) -> None:
    async with borrowed(thinking_users) as server:
        client = sdk(server)
        fields: dict[str, Any] = {
            "model": "tiny",
            "input": "hi",
            "user": "think",
            "max_output_tokens": 40,
            "temperature": 0,
        }
        response = await client.responses.create(**fields)
        async with client.responses.stream(**fields) as stream:
            events = [event async for event in stream]
            streamed = await stream.get_final_response()
    for got in (response, streamed):
        validate(
            got.model_dump(exclude_unset=True, by_alias=True, mode="json", warnings=False),
            "Response",
        )
        reasoning, message = got.output
        assert reasoning.type == "reasoning" and message.type == "message"
        assert [part.text for part in reasoning.content or []] == ["I ponder."]
        assert reasoning.status == "completed"
        assert got.output_text == "Hello there"
        assert got.usage is not None
        tokens = token_count(thinking_model, THOUGHT)
        assert got.usage.output_tokens_details.reasoning_tokens == tokens
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == "I ponder."
    order = [e.type for e in events if e.type.startswith("response.output_item")]
    assert order == ["response.output_item.added", "response.output_item.done"] * 2
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done.text == "I ponder."


async def test_grammars_hold_the_answer_after_free_thinking(thinking_model: Path) -> None:
    """A format or a forced call applies after `</think>`: the scripted thinking (which a
    grammar from the first token would refuse) runs, then the random model is held."""
    processors = scripted({"think": THOUGHT}, thinking_model, then_free=True)
    json_format = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
    async with running_server(thinking_model, extra_processors=processors) as server:
        client = sdk(server)
        common: dict[str, Any] = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "A pet?"}],
            "user": "think",
            "max_tokens": 120,
            "temperature": 1.0,
        }
        formatted = [
            await client.chat.completions.create(**common, response_format=json_format, seed=s)
            for s in range(3)
        ]
        called = await client.chat.completions.create(
            **common, tools=[TOOL], tool_choice="required", seed=0
        )
        unopened = await client.chat.completions.create(
            **{**common, "user": "free", "max_tokens": 6},
            response_format=json_format,
            logit_bias={"2046": -100},  # `<think>`: the model does not open its thinking
            seed=1,
        )
    for reply in formatted:
        message = reply.choices[0].message
        assert message.reasoning_content == "I ponder."  # type: ignore[attr-defined]
        if reply.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(message.content or ""), SCHEMA)
    assert any(r.choices[0].finish_reason == "stop" for r in formatted)
    assert called.choices[0].message.reasoning_content == "I ponder."  # type: ignore[attr-defined]
    (call,) = called.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments).keys() == {"zone"}
    # A model that does not open its thinking is held from its first token.
    assert (unopened.choices[0].message.content or "").startswith("{")


async def test_a_tool_call_inside_the_thinking_is_reasoning(thinking_model: Path) -> None:
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    processors = scripted({"think": f"<think>\n{call}\n</think>\n\nNo call."}, thinking_model)
    async with running_server(thinking_model, extra_processors=processors) as server:
        reply = await sdk(server).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "time?"}],
            tools=[TOOL],  # type: ignore[list-item]
            user="think",
            max_tokens=80,
            temperature=0,
        )
    message = reply.choices[0].message
    assert (message.content, message.tool_calls) == ("No call.", None)
    assert message.reasoning_content == call  # type: ignore[attr-defined]
    assert reply.choices[0].finish_reason == "stop"


async def test_reasoning_sent_back_reaches_a_thinking_template(thinking_model: Path) -> None:
    """An assistant turn's `reasoning_content` (or `reasoning`) is rendered by a template that
    shows it (Qwen3's: after the last user message), and refused on other roles."""
    async with (
        running_server(thinking_model) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):

        async def prompt_tokens(assistant: dict[str, Any]) -> int:
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}, assistant],
                "max_tokens": 1,
            }
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return int(response.json()["usage"]["prompt_tokens"])

        flat = {"type": "function", **TOOL["function"]}
        plain = await prompt_tokens({"role": "assistant", "content": "yes"})
        shown = token_count(thinking_model, "<think>\nI ponder.\n</think>\n\n")
        for name in ("reasoning_content", "reasoning"):
            with_reasoning = {"role": "assistant", "content": "yes", name: "I ponder."}
            assert await prompt_tokens(with_reasoning) == plain + shown
        # A Responses reasoning item is the reasoning of the assistant turn it precedes.
        call = {"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": "{}"}
        turn = [
            {"role": "user", "content": "hi"},
            call,
            {"type": "function_call_output", "call_id": "c1", "output": "noon"},
        ]
        item = {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "I ponder."}],
        }
        without, with_item = [
            (
                await http.post(
                    "/v1/responses",
                    json={"model": "tiny", "input": given, "max_output_tokens": 1, "tools": [flat]},
                )
            ).json()["usage"]["input_tokens"]
            for given in (turn, [turn[0], item, *turn[1:]])
        ]
        assert with_item == without + shown
        refused = await http.post(
            "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi", "reasoning_content": "x"}],
            },
        )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "messages[0].reasoning_content"


async def test_a_model_that_does_not_think_is_unchanged(tiny_model: Path) -> None:
    async with running_server(tiny_model) as server:
        client = sdk(server)
        reply = await client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": "<think>hi"}],
            max_tokens=4,
            temperature=0,
            reasoning_effort="none",
        )
    parsed = reply.parse()
    assert reply.headers["x-ignored-params"] == "reasoning_effort"
    assert "reasoning_content" not in parsed.choices[0].message.model_dump()
    assert parsed.usage is not None and parsed.usage.completion_tokens_details is not None
    assert parsed.usage.completion_tokens_details.reasoning_tokens == 0


async def test_the_messages_api_sends_thinking_blocks(thinking_model: Path) -> None:
    """Anthropic's route: the reasoning as a thinking block before the text (a body, and a
    stream's thinking_delta events closed by a signature_delta); `thinking` switches the
    template; a thinking block sent back is the assistant turn's reasoning."""
    import anthropic

    by_user = scripted(SCRIPTS, thinking_model)
    processors = lambda body: by_user({"user": (body.get("metadata") or {}).get("user_id")})  # noqa: E731
    async with running_server(thinking_model, extra_processors=processors) as server:
        client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="x", max_retries=0)
        fields: dict[str, Any] = {
            "model": "tiny",
            "max_tokens": 40,
            "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"user_id": "think"},
            "extra_body": {"temperature": 0},
        }
        try:
            message = await client.messages.create(**fields)
            async with client.messages.stream(**fields) as stream:
                events = [event async for event in stream]
                final = await stream.get_final_message()

            async def counted(**more: Any) -> int:
                return (
                    await client.messages.count_tokens(
                        model="tiny", messages=fields["messages"], **more
                    )
                ).input_tokens

            default, on, off = (
                await counted(),
                await counted(thinking={"type": "enabled", "budget_tokens": 1024}),
                await counted(thinking={"type": "disabled"}),
            )
            # A thinking block before a call, within the turn the tool's result answers: where
            # a Qwen3-style template renders the reasoning it is given.
            call = {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}
            result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "noon"}
            thought = {"type": "thinking", "thinking": "A long thought. " * 8, "signature": ""}
            history = [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [thought, call]},
                {"role": "user", "content": [result]},
            ]
            with_thought = await client.messages.count_tokens(model="tiny", messages=history)
            history[1] = {"role": "assistant", "content": [call]}
            without = await client.messages.count_tokens(model="tiny", messages=history)
            budget = await client.messages.with_raw_response.create(
                **{**fields, "metadata": None},
                thinking={"type": "enabled", "budget_tokens": 1024},
            )
        finally:
            await client.close()
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "I ponder."  # type: ignore[union-attr]
    assert message.content[1].text == "Hello there"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in
            final.content] == [("thinking", "I ponder."), ("text", "Hello there")]  # fmt: skip
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas.index("signature_delta") < deltas.index("text_delta")
    assert set(deltas[: deltas.index("signature_delta")]) == {"thinking_delta"}
    # The template's switch: off closes an empty think block in the prompt, on is its default.
    assert on == default and off > on
    assert with_thought.input_tokens > without.input_tokens
    assert budget.headers["x-ignored-params"] == "thinking.budget_tokens"
