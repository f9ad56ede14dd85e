"""Logprobs over the real server: shapes, the concatenation invariant, greedy = top-1, batching."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    engine_of,
    running_server,
    server_thread,
    sse_events,
    validate,
)


@pytest.fixture(scope="module")
def plain(tiny_model: Path) -> Iterator[ThreadedServer]:
    """The tiny model served with the defaults, for the tests that need no other settings."""
    with server_thread(tiny_model) as served:
        yield served


def _check_entries(content: str, entries: list[dict[str, Any]], top: int, greedy: bool) -> None:
    assert "".join(e["token"] for e in entries) == content
    # Each entry's bytes are its token's own: together they decode to the content (invalid
    # sequences a random model emits become U+FFFD there, as in the content).
    assert bytes(b for e in entries for b in e["bytes"]).decode("utf-8", "replace") == content
    for entry in entries:
        if entry["bytes"] and not entry["token"]:
            assert bytes(entry["bytes"]).decode("utf-8", "replace").endswith("\ufffd")
        assert entry["logprob"] <= 0.0
        assert len(entry["top_logprobs"]) == top
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-4
        if greedy and entry["token"]:
            assert math.isclose(entry["logprob"], values[0], abs_tol=1e-4)


async def test_chat_logprobs_streaming_and_not(plain: ThreadedServer) -> None:
    fields = {"max_tokens": 16, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        reply = (
            await http.post("/v1/chat/completions", json=chat_body("Tell a tale.", **fields))
        ).json()
        async with http.stream(
            "POST", "/v1/chat/completions", json=chat_body("Tell a tale.", stream=True, **fields)
        ) as response:
            chunks = (await sse_events(response))[:-1]
    validate(reply, "CreateChatCompletionResponse")
    content = reply["choices"][0]["message"]["content"]
    entries = reply["choices"][0]["logprobs"]["content"]
    assert len(entries) == reply["usage"]["completion_tokens"] == 16
    _check_entries(content, entries, 3, greedy=True)
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0].get("logprobs")
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert [e["token"] for e in streamed] == [e["token"] for e in entries]
    assert all(
        math.isclose(a["logprob"], b["logprob"], abs_tol=1e-4)
        for a, b in zip(streamed, entries, strict=True)
    )


async def test_logprobs_stop_at_a_stop_string_and_hold_under_batching(
    plain: ThreadedServer,
) -> None:
    fields = {"max_tokens": 30, "temperature": 1.0, "logprobs": True}
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        probe = (await http.post("/v1/chat/completions", json=chat_body(seed=5, **fields))).json()
        full = probe["choices"][0]["message"]["content"]
        stop = full[len(full) // 2 : len(full) // 2 + 2]
        replies: dict[int, Any] = {}

        async def one(seed: int) -> None:
            body = chat_body(seed=seed, stop=[stop] if seed == 5 else None, **fields)
            replies[seed] = (await http.post("/v1/chat/completions", json=body)).json()

        async with trio.open_nursery() as nursery:
            for seed in range(5, 11):
                nursery.start_soon(one, seed)
    cut = replies[5]["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["message"]["content"] == full[: full.index(stop)]
    for reply in replies.values():
        choice = reply["choices"][0]
        _check_entries(choice["message"]["content"], choice["logprobs"]["content"], 0, greedy=False)


async def test_completions_logprobs(plain: ThreadedServer) -> None:
    body = {
        "model": "tiny",
        "prompt": "Once upon",
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": 2,
    }
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        reply = (await http.post("/v1/completions", json=body)).json()
        async with http.stream(
            "POST", "/v1/completions", json={**body, "stream": True}
        ) as response:
            chunks = (await sse_events(response))[:-1]
        bad = await http.post("/v1/completions", json={**body, "logprobs": 9})
    validate(reply, "CreateCompletionResponse")
    choice = reply["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert len(logprobs["token_logprobs"]) == 10 and all(
        len(t) <= 2 for t in logprobs["top_logprobs"]
    )
    offsets = logprobs["text_offset"]
    assert offsets == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(len(offsets))]
    streamed = [
        t
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for t in c["choices"][0]["logprobs"]["tokens"]
    ]
    assert streamed == logprobs["tokens"]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logprobs"


async def test_responses_logprobs(plain: ThreadedServer) -> None:
    from tests.http_helpers import sdk

    async with borrowed(plain) as server:
        client = sdk(server)
        created = await client.responses.create(
            model="tiny",
            input="Tell a tale.",
            max_output_tokens=12,
            temperature=0,
            top_logprobs=2,
            include=["message.output_text.logprobs"],
        )
        events = []
        async with client.responses.stream(
            model="tiny",
            input="Tell a tale.",
            max_output_tokens=12,
            temperature=0,
            top_logprobs=2,
            include=["message.output_text.logprobs"],
        ) as stream:
            async for event in stream:
                events.append(event)
    body = created.model_dump(exclude_unset=True, mode="json", warnings=False)
    validate(body, "Response")
    part = body["output"][0]["content"][0]
    _check_entries(part["text"], part["logprobs"], 2, greedy=True)
    streamed = [
        e.model_dump()
        for ev in events
        if ev.type == "response.output_text.delta"
        for e in ev.logprobs
    ]
    assert [e["token"] for e in streamed] == [e["token"] for e in part["logprobs"]]


async def test_stream_interval_writes_fewer_chunks_and_keeps_every_token(tiny_model: Path) -> None:
    """--stream-interval 4: the first token goes at once, then at least four per write;
    logprobs count the tokens in each chunk."""
    fields = {"max_tokens": 17, "temperature": 0, "logprobs": True}
    async with (
        running_server(tiny_model, stream_interval=4) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        reply = (
            await http.post("/v1/chat/completions", json=chat_body("Tell a tale.", **fields))
        ).json()
        async with http.stream(
            "POST", "/v1/chat/completions", json=chat_body("Tell a tale.", stream=True, **fields)
        ) as response:
            chunks = (await sse_events(response))[:-1]
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    with_tokens = [
        c["choices"][0] for c in chunks if c["choices"] and c["choices"][0].get("logprobs")
    ]
    per_write = [len(choice["logprobs"]["content"]) for choice in with_tokens]
    assert sum(per_write) == 17
    assert all(n >= 4 for n in per_write[1:-1]), per_write
    assert len(per_write) <= 1 + math.ceil(16 / 4), per_write
    assert (
        "".join(c["delta"].get("content") or "" for c in with_tokens)
        == reply["choices"][0]["message"]["content"]
    )


async def test_default_interval_follows_the_number_of_open_streams(tiny_model: Path) -> None:
    """The default (0) adapts: with 16 other streams open, each write after a stream's first
    carries at least 1 + 16 // 8 = 3 tokens, counted by logprobs."""
    fields = {"max_tokens": 13, "temperature": 0, "logprobs": True}
    async with (
        running_server(tiny_model, max_concurrency=17) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        bias = {str(t): -100 for t in engine_of(server).model.eos_token_ids}
        others = chat_body("Go on.", stream=True, max_tokens=400, logit_bias=bias)
        all_open = trio.Event()
        opened: list[int] = []

        async def hold_open() -> None:
            async with http.stream("POST", "/v1/chat/completions", json=others) as response:
                async for _ in response.aiter_lines():
                    if len(opened) < 16:
                        opened.append(1)
                        if len(opened) == 16:
                            all_open.set()

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(hold_open)
            await all_open.wait()
            async with http.stream(
                "POST",
                "/v1/chat/completions",
                json=chat_body("Tell a tale.", stream=True, **fields),
            ) as response:
                chunks = (await sse_events(response))[:-1]
            assert server.parts.writes.open_streams == 16  # the others are still streaming
            nursery.cancel_scope.cancel()
    per_write = [
        len(c["choices"][0]["logprobs"]["content"])
        for c in chunks
        if c["choices"] and c["choices"][0].get("logprobs")
    ]
    assert sum(per_write) == 13
    assert all(n >= 3 for n in per_write[1:-1]), per_write


async def test_logprob_bytes_are_the_tokens_own_bytes(plain: ThreadedServer) -> None:
    """The random model emits tokens that hold parts of multi-byte characters: their text is
    "" until a later token completes the character, but their bytes are what they hold."""
    fields = {"max_tokens": 48, "temperature": 1.0, "logprobs": True, "top_logprobs": 2}
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        split = []
        for seed in range(8):
            reply = (
                await http.post(
                    "/v1/chat/completions", json=chat_body("Tell a tale.", seed=seed, **fields)
                )
            ).json()
            choice = reply["choices"][0]
            entries = choice["logprobs"]["content"]
            _check_entries(choice["message"]["content"], entries, 2, greedy=False)
            split += [e for e in entries if e["bytes"] and not e["token"]]
            for entry in entries:
                for alternative in entry["top_logprobs"]:  # alternatives are whole tokens
                    assert (
                        bytes(alternative["bytes"]).decode("utf-8", "replace")
                        == alternative["token"]
                    )
    assert split, "the random model should split characters across tokens"


async def test_completions_text_is_the_exact_continuation(plain: ThreadedServer) -> None:
    """prompt + text is the whole: a first token with a leading space keeps it."""
    async with (
        borrowed(plain) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        tokenizer = engine_of(server).model.tokenizer
        space_first = next(
            t
            for t in range(300, 2000)
            if tokenizer.decode([t]).startswith(" ") and tokenizer.decode([t]).strip().isalpha()
        )
        body = {
            "model": "tiny",
            "prompt": "Hello, my name is",
            "max_tokens": 3,
            "temperature": 0,
            "logprobs": 1,
            "logit_bias": {str(space_first): 100},
        }
        reply = (await http.post("/v1/completions", json=body)).json()
        chat = (
            await http.post(
                "/v1/chat/completions",
                json=chat_body(
                    "hi", max_tokens=3, temperature=0, logit_bias={str(space_first): 100}
                ),
            )
        ).json()
    choice = reply["choices"][0]
    word = tokenizer.decode([space_first])
    assert choice["text"] == word * 3
    assert choice["logprobs"]["tokens"] == [word] * 3
    assert chat["choices"][0]["message"]["content"] == (word * 3)[1:]  # a chat reply drops it
