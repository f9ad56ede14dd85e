"""The API through a real Hypercorn server: the official SDK, httpx, and the OpenAPI schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    engine_of,
    running_server,
    sdk,
    server_thread,
    sse_events,
    validate,
    validate_error,
)


@pytest.fixture(scope="module")
def plain(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model served with the defaults, for the tests that need no other settings."""
    with server_thread(tiny_model) as served:
        yield served


async def test_health_and_models(plain: ThreadedServer) -> None:
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        health = await http.get("/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        assert health.headers["x-request-id"].startswith("req_")

        listed = (await http.get("/v1/models")).json()
        validate(listed, "ListModelsResponse")
        assert [m["id"] for m in listed["data"]] == ["tiny"]
        assert listed["data"][0]["context_length"] == 4096

        models = await sdk(server).models.list()
        assert [m.id for m in models.data] == ["tiny"]
        validate((await http.get("/v1/models/tiny")).json(), "Model")


async def test_chat_streaming_equals_non_streaming(plain: ThreadedServer) -> None:
    fields = {"max_tokens": 24, "temperature": 1.0, "seed": 11}
    async with borrowed(plain) as server:
        client = sdk(server)
        full = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Tell me a story."}], **fields
        )
        validate(full.model_dump(exclude_unset=True), "CreateChatCompletionResponse")
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Tell me a story."}],
            stream=True,
            stream_options={"include_usage": True},
            **fields,
        )
        chunks = [chunk async for chunk in stream]

    text = full.choices[0].message.content
    assert text and full.choices[0].finish_reason == "length"
    for chunk in chunks:
        validate(chunk.model_dump(exclude_unset=True), "CreateChatCompletionStreamResponse")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert {c.id for c in chunks} == {chunks[0].id}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens == 24
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # The second identical prompt reused the first one's prefix KV.
    assert usage.prompt_tokens_details.cached_tokens > 0


async def test_raw_sse_framing_and_usage_nulls(plain: ThreadedServer) -> None:
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        body = chat_body(max_tokens=5, temperature=0, stream=True)
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = await sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("usage" not in c for c in chunks), "no usage key unless include_usage"
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_completions_endpoint(plain: ThreadedServer) -> None:
    async with borrowed(plain) as server:
        client = sdk(server)
        full = await client.completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0
        )
        validate(full.model_dump(exclude_unset=True), "CreateCompletionResponse")
        stream = await client.completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0, stream=True
        )
        chunks = [c async for c in stream]
        tokens = await client.completions.create(model="tiny", prompt=[12, 40, 99], max_tokens=3)
    assert full.object == "text_completion" and full.usage.completion_tokens == 12
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert tokens.usage.prompt_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_across_token_boundaries(plain: ThreadedServer, stream: bool) -> None:
    fields = {"max_tokens": 40, "temperature": 1.0, "seed": 3}
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        body = chat_body(**fields, stream=True)
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            pieces = [
                e["choices"][0]["delta"].get("content", "")
                for e in (await sse_events(response))[1:-1]
                if e["choices"]
            ]
        # A stop string made of the end of one token's text and the start of the next one.
        k = next(i for i in range(4, len(pieces) - 1) if len(pieces[i]) >= 2 and pieces[i + 1])
        stop = pieces[k][-2:] + pieces[k + 1][:1]
        full = "".join(pieces)
        expected = full[: full.index(stop)]

        body = chat_body(**fields, stop=[stop, "never-appears-xyz"], stream=stream)
        if stream:
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                events = (await sse_events(response))[:-1]
            text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
            finish = events[-1]["choices"][0]["finish_reason"]
        else:
            reply = (await http.post("/v1/chat/completions", json=body)).json()
            validate(reply, "CreateChatCompletionResponse")
            text, finish = (
                reply["choices"][0]["message"]["content"],
                reply["choices"][0]["finish_reason"],
            )
    assert text == expected
    assert finish == "stop"
    assert (
        stop[0] not in text[len(expected) - 0 :]
    )  # nothing after the cut, not even a partial stop


async def test_a_replayed_refusal_is_what_the_assistant_said(plain: ThreadedServer) -> None:
    """An assistant turn holding a refusal (a content part, or the message's `refusal` with no
    content, as a client replays OpenAI's reply) renders as that text, not a 400."""

    def turns(assistant: dict[str, Any]) -> dict[str, Any]:
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", **assistant},
            {"role": "user", "content": "ok"},
        ]
        return chat_body(messages=messages, max_tokens=1, temperature=0)

    said = "I can't help with that."
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        prompts = []
        for assistant in (
            {"content": said},
            {"content": [{"type": "refusal", "refusal": said}]},
            {"content": None, "refusal": said},
            {"content": ""},
        ):
            reply = await http.post("/v1/chat/completions", json=turns(assistant))
            assert reply.status_code == 200, reply.text
            prompts.append(reply.json()["usage"]["prompt_tokens"])
        assert prompts[0] == prompts[1] == prompts[2] > prompts[3]
        user_refusal = chat_body(
            messages=[{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}]
        )
        refused = await http.post("/v1/chat/completions", json=user_refusal)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "messages[0].content[0].type"
        # A part of a kind that is taken, without its field, names the missing field.
        for part, field in (({"type": "text"}, "text"), ({"type": "refusal"}, "refusal")):
            messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [part]}]
            missing = await http.post("/v1/chat/completions", json=chat_body(messages=messages))
            assert missing.status_code == 400
            error = missing.json()["error"]
            assert error["code"] == "missing_required_parameter"
            assert error["param"] == f"messages[1].content[0].{field}"


async def test_error_envelopes_and_the_server_keeps_serving(plain: ThreadedServer) -> None:
    cases: list[tuple[object, int, str | None]] = [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        ({"model": "tiny", "messages": []}, 400, "messages"),
        ({"model": "tiny"}, 400, "messages"),
        (chat_body(max_tokens="ten"), 400, "max_tokens"),
        (chat_body(temperature=7), 400, "temperature"),
        (chat_body(max_tokens=10**12), 400, "messages"),
        (chat_body(max_tokens=0), 400, "max_tokens"),
        (chat_body(n=2), 400, "n"),
        (chat_body(n=0), 400, "n"),
        (chat_body(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
        (chat_body(tools=[{"type": "web_search"}]), 400, "tools[0].type"),
        (
            chat_body(
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {"name": "g"}},
            ),
            400,
            "tool_choice",
        ),
        (
            chat_body(
                tools=[
                    {
                        "type": "function",
                        "function": {  # strict, and not enforceable
                            "name": "f",
                            "strict": True,
                            "parameters": {
                                "type": "object",
                                "properties": {"x": {"type": "string", "format": "not-a-format"}},
                            },
                        },
                    }
                ]
            ),
            400,
            "tools",
        ),
        (chat_body(top_logprobs=3), 400, "top_logprobs"),
        (chat_body(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
        (
            chat_body(
                response_format={
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "string", "format": "not-a-format"},
                    },
                }
            ),
            400,
            "response_format.json_schema.schema",
        ),
        (chat_body(response_format={"type": "yaml"}), 400, "response_format.type"),
        (chat_body(frobnicate=1), 400, "frobnicate"),
        (
            {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "messages[0].role",
        ),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": 5}]},
            400,
            "messages[0].content",
        ),
        (
            {
                "model": "tiny",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                    }
                ],
            },
            400,
            "messages[0].content[0].type",
        ),
        (chat_body("word " * 5000, max_tokens=4), 400, "messages"),
        ({**chat_body(), "model": "gpt-4o"}, 404, "model"),
    ]
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        for body, status, param in cases:
            content = body if isinstance(body, bytes) else None
            response = await http.post(
                "/v1/chat/completions", content=content, json=None if content else body
            )
            assert response.status_code == status, (body, response.text)
            validate_error(response.json())
            assert response.json()["error"]["param"] == param, (body, response.text)
            assert "Traceback" not in response.text
        tokens = await http.post(
            "/v1/chat/completions", json=chat_body("word " * 5000, max_tokens=4)
        )
        assert "4096" in tokens.json()["error"]["message"]
        assert tokens.json()["error"]["code"] == "context_length_exceeded"
        assert (
            "'tiny'"
            in (await http.post("/v1/chat/completions", json={**chat_body(), "model": "x"})).json()[
                "error"
            ]["message"]
        )
        missing = await http.get("/v1/nothing-here")
        assert missing.status_code == 404
        validate_error(missing.json())
        ok = await http.post("/v1/chat/completions", json=chat_body(max_tokens=3, temperature=0))
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


async def test_engine_settings_reach_the_served_engine(tiny_model: Path, tmp_path: Path) -> None:
    """--prefill-step-size, --prefill-batch-size, --prefill-chunk-ms, --cudnn-attention,
    --cuda-graphs, --no-fuse-weights, --no-ragged-attention, --pack-chunks, --skip-warmup,
    --prompt-cache-dir and --prompt-cache-disk-bytes configure the engine a server runs: a
    prompt longer than the step is prefilled in chunks of that size."""
    async with (
        running_server(
            tiny_model,
            prefill_step_size=16,
            prefill_batch_size=2,
            prefill_chunk_ms=40.0,
            cudnn_attention=True,
            cuda_graphs=True,
            prompt_cache_bytes=0,
            no_fuse_weights=True,
            no_ragged_attention=True,
            pack_chunks=True,
            skip_warmup=True,
            prompt_cache_dir=str(tmp_path / "kv"),
            prompt_cache_disk_bytes=64 << 20,
        ) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        engine = engine_of(server)
        assert engine is not None
        config = engine.config
        assert (config.prefill_step_size, config.prefill_batch_size) == (16, 2)
        assert config.prefill_chunk_ms == 40.0
        assert config.cudnn_attention
        assert config.cuda_graphs  # --cuda-graphs; off by default
        assert not config.fuse_weights  # --no-fuse-weights; on by default
        assert not config.ragged_attention  # --no-ragged-attention; on by default
        assert config.pack_chunks  # --pack-chunks; off by default
        assert not config.warmup  # --skip-warmup; on by default
        assert config.prompt_cache_dir == tmp_path / "kv"
        assert config.prompt_cache_disk_bytes == 64 << 20
        prompt = " ".join(["waves"] * 60)
        reply = await http.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0},
        )
        assert reply.status_code == 200
        stats = engine.statistics().worker
        prompt_tokens = reply.json()["usage"]["prompt_tokens"]
        metrics = (await http.get("/metrics")).text
    assert stats is not None and prompt_tokens > 32
    assert stats.prefix_disk is not None  # the disk tier runs, with no memory tier beside it
    assert 'mlx_nursery:prefix_cache_disk_writes_total{model_name="tiny"} 0.0' in metrics
    # A lone prompt on the fast path: full 16-token chunks, then one forward for the rest
    # (with the default step of 512, one forward in all).
    assert stats.prefill_forwards == -(-prompt_tokens // 16)


async def test_the_kv_budget_caps_the_context_a_server_lists_and_accepts(tiny_model: Path) -> None:
    """--kv-cache-bytes for 1,024 tokens of the tiny model's KV (512 bytes each): the server
    lists a context of 768 (the model's is 4,096) and refuses what needs more with OpenAI's
    context_length_exceeded, not with a failed step."""
    async with (
        running_server(tiny_model, kv_cache_bytes=1024 * 512) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        listed = (await http.get("/v1/models")).json()
        assert listed["data"][0]["context_length"] == 768
        too_long = await http.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "waves " * 100, "max_tokens": 700},
        )
        assert too_long.status_code == 400
        validate_error(too_long.json())
        assert too_long.json()["error"]["code"] == "context_length_exceeded"
        fits = await http.post(  # greedy: a sampled token may be EOS, ending it early
            "/v1/completions",
            json={"model": "tiny", "prompt": "waves " * 100, "max_tokens": 5, "temperature": 0},
        )
        assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == 5
