"""Cancelling a request by its id (`POST /v1/requests/{id}/cancel`) over a real server, on
the scripted model: a stream, a non-streaming request and a queued one end with the cancel's
error and give their lane back, the engine's cancel counter and /metrics count it; ids are
found only by the key that made the request (or an admin key), another key's is the 404 of
an id that never existed. On the tiny model, a cancel mid-prefill stops it between chunks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
import trio.testing

from mlx_nursery.engine import WorkerStats
from mlx_nursery.server import Running
from tests.helpers import Gate
from tests.http_helpers import (
    engine_of,
    eventually,
    running_server,
    sdk,
    server_thread,
    validate_error,
)

KEYS = {"a": "key-a", "b": "key-b", "admin": "root-key"}
STALLED: dict[str, Any] = {
    "output": {"text": "One two three four five six seven."},
    "stalls": [{"at": 2, "seconds": 600}],
}
"""Two pieces, then a stall no test waits out: what is cut short is the cancel's doing."""
USER = [{"role": "user", "content": "Say something."}]
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": USER}),
    "completions": ("/v1/completions", {"prompt": "Say something."}),
    "responses": ("/v1/responses", {"input": "Say something."}),
    "messages": ("/v1/messages", {"messages": USER, "max_tokens": 64}),
}


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with server_thread(
        None,
        model=["scripted"],
        api_key=(KEYS["a"], KEYS["b"]),
        admin_key=(KEYS["admin"],),
        max_concurrency=1,
    ) as served:
        yield served.running


@pytest.fixture
async def http(server: Running) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    clients = {
        name: httpx.AsyncClient(
            base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        for name, key in KEYS.items()
    }
    yield clients
    for client in clients.values():
        await client.aclose()
    await eventually(lambda: engine_of(server).statistics().lanes_borrowed == 0, "lanes back")


def _body(route: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    path, body = ROUTES[route]
    return path, {"model": "scripted", "script": STALLED, **body, **fields}


def _generated(server: Running) -> int:
    worker = engine_of(server).statistics().worker
    return worker.generated_tokens if worker is not None else 0


def _cancelled(server: Running) -> int:
    return engine_of(server).statistics().cancellations.confirmed


async def _metric(http: httpx.AsyncClient, cause: str) -> float:
    text = (await http.get("/metrics")).text
    prefix = f'mlx_nursery:request_cancelled_total{{cause="{cause}",model_name="scripted"}} '
    values = [float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
    return values[0] if values else 0.0


async def _cancel(http: httpx.AsyncClient, request_id: str) -> httpx.Response:
    return await http.post(f"/v1/requests/{request_id}/cancel")


def _assert_cancel_error(error: dict[str, Any], request_id: str) -> None:
    assert error["code"] == "request_cancelled", error
    assert f"{request_id} was cancelled" in error["message"]


@pytest.mark.parametrize("route", ROUTES)
async def test_a_cancel_ends_a_stream_with_its_error_and_stops_the_compute(
    server: Running, http: dict[str, httpx.AsyncClient], route: str
) -> None:
    a = http["a"]
    before, counted = _cancelled(server), await _metric(a, "cancel")
    path, body = _body(route, stream=True)
    async with a.stream("POST", path, json=body) as streamed:
        request_id = streamed.headers["x-request-id"]  # the server made it
        lines = streamed.aiter_lines()
        async for line in lines:  # the stream runs: it has sent its first event
            if line.startswith("data: "):
                break
        answer = await _cancel(a, request_id)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"id": request_id, "object": "request", "cancelled": True}
        payloads = [json.loads(line[6:]) async for line in lines if line.startswith("data: ")]
    last = payloads[-1]
    if route == "messages":  # Anthropic's envelope has no code: the message names the cancel
        assert last["type"] == "error" and last["error"]["type"] == "invalid_request_error"
        assert f"{request_id} was cancelled" in last["error"]["message"]
    elif route == "responses":  # the error, then the response as it ended: cancelled
        assert last["type"] == "response.failed"
        assert last["response"]["status"] == "cancelled"
        assert payloads[-2]["type"] == "error"
        _assert_cancel_error(payloads[-2], request_id)
    else:
        validate_error(last)
        _assert_cancel_error(last["error"], request_id)
    await eventually(lambda: _cancelled(server) == before + 1, "the engine confirms the cancel")
    assert await _metric(a, "cancel") == counted + 1
    finished = await _cancel(a, request_id)  # it is over: nothing is left to cancel
    assert finished.status_code == 404


async def test_a_cancel_ends_a_non_streaming_request_with_a_409_the_sdk_does_not_retry(
    server: Running, http: dict[str, httpx.AsyncClient]
) -> None:
    """The client names its request itself (x-request-id): it knows the id before its answer.
    The SDK would retry a 409 (twice here) but for `x-should-retry: false`."""
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=KEYS["a"], max_retries=2)
    before, generated = _cancelled(server), _generated(server)
    outcome: list[BaseException] = []

    async def ask() -> None:
        try:
            await client.chat.completions.create(
                model="scripted",
                messages=USER,  # type: ignore[arg-type]
                extra_body={"script": STALLED},
                extra_headers={"x-request-id": "agent-run-7"},
            )
        except openai.APIStatusError as exc:
            outcome.append(exc)

    async with client, trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await eventually(lambda: _generated(server) > generated, "the request is generating")
        answer = await _cancel(http["a"], "agent-run-7")
        assert answer.status_code == 200, answer.text
    [raised] = outcome
    assert isinstance(raised, openai.ConflictError)
    assert raised.response.headers["x-should-retry"] == "false"
    body = raised.response.json()
    validate_error(body)
    _assert_cancel_error(body["error"], "agent-run-7")
    assert _cancelled(server) == before + 1  # one attempt, cancelled once: no retry ran


async def test_a_cancel_while_queued_answers_at_once_and_never_reaches_the_engine(
    server: Running, http: dict[str, httpx.AsyncClient]
) -> None:
    a, engine = http["a"], engine_of(server)
    path, holding = _body("chat", stream=True)
    async with a.stream("POST", path, json=holding) as holder:  # holds the only lane
        lines = holder.aiter_lines()  # kept: an iterator dropped closes its connection
        async for line in lines:
            if line.startswith("data: "):
                break
        before = _cancelled(server)
        replies: list[httpx.Response] = []

        async def queued() -> None:
            path, body = _body("completions")
            replies.append(await a.post(path, json=body, headers={"x-request-id": "in-line"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(queued)
            await eventually(lambda: engine.statistics().queued == 1, "the request waits")
            assert (await _cancel(a, "in-line")).status_code == 200
        [reply] = replies
        assert reply.status_code == 409
        assert reply.headers["x-should-retry"] == "false"
        validate_error(reply.json())
        _assert_cancel_error(reply.json()["error"], "in-line")
        assert engine.statistics().queued == 0
        assert _cancelled(server) == before  # never submitted: nothing for the engine to stop


async def test_only_the_requests_key_or_an_admin_key_finds_its_id(
    server: Running, http: dict[str, httpx.AsyncClient]
) -> None:
    a, b, admin = http["a"], http["b"], http["admin"]
    unknown = await _cancel(a, "never-was")
    assert unknown.status_code == 404
    validate_error(unknown.json())
    assert unknown.json()["error"]["code"] == "request_not_found"
    path, body = _body("chat", stream=True)
    async with a.stream("POST", path, json=body, headers={"x-request-id": "tenant-a"}) as streamed:
        lines = streamed.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                break
        other = await _cancel(b, "tenant-a")  # b's view: as if no such request existed
        missing = await _cancel(b, "never-was")
        assert other.status_code == missing.status_code == 404
        assert other.json() == json.loads(missing.text.replace("never-was", "tenant-a"))
        assert (await _cancel(admin, "tenant-a")).status_code == 200
        payloads = [json.loads(line[6:]) async for line in lines if line.startswith("data: ")]
    _assert_cancel_error(payloads[-1]["error"], "tenant-a")
    async with httpx.AsyncClient(base_url=a.base_url) as anonymous:
        assert (await anonymous.post("/v1/requests/x/cancel")).status_code == 401
    with_body = await a.post("/v1/requests/x/cancel", json={"reason": "why not"})
    assert with_body.status_code == 400


async def test_a_cancel_during_a_long_prefill_stops_it_between_chunks(tiny_model: Path) -> None:
    """A real model prefilling a 1,024-token prompt in 16-token chunks beside a decoding
    stream, cancelled by id mid-prefill: a 409 the SDK does not retry, and at most the chunk
    in flight ran after the cancel. The decoding stream's gates hold the engine thread at known
    steps: first while the long request is submitted, then a few chunks into its prefill."""
    token = trio.lowlevel.current_trio_token()
    submitting, prefilling = Gate(token, at_call=2), Gate(token, at_call=1 << 30)

    def processors(body: Any) -> tuple[Any, ...]:
        return (submitting, prefilling) if body.get("user") == "decoder" else ()

    async with (
        running_server(
            tiny_model, skip_warmup=True, max_concurrency=2, prefill_step_size=16,
            extra_processors=processors,
        ) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):  # fmt: skip
        client, engine = sdk(server, max_retries=2), engine_of(server)
        no_eos = {str(eos): -100 for eos in engine.model.eos_token_ids}
        prompt = [10 + i % 1900 for i in range(1024)]
        outcome: list[BaseException] = []

        def worker() -> WorkerStats:
            stats = engine.statistics().worker
            assert stats is not None
            return stats

        async def decode() -> None:
            stream = await client.chat.completions.create(
                model="tiny", messages=USER, max_tokens=3000, stream=True,  # type: ignore[arg-type]
                logit_bias=no_eos, user="decoder",
            )  # fmt: skip
            async for _ in stream:
                pass

        async def ask() -> None:
            try:
                await client.completions.create(
                    model="tiny", prompt=prompt, max_tokens=4,
                    extra_headers={"x-request-id": "long-prefill"},
                )  # fmt: skip
            except openai.APIStatusError as exc:
                outcome.append(exc)

        async with trio.open_nursery() as decoding:
            decoding.start_soon(decode)
            await submitting.reached.wait()
            before, cancels = worker(), engine.statistics().cancellations
            async with trio.open_nursery() as asking:
                asking.start_soon(ask)
                await eventually(lambda: engine.statistics().lanes_borrowed == 2, "submitted")
                prefilling.arm(5)  # five decode steps on: the prompt's first chunks ran
                submitting.open()
                await prefilling.reached.wait()
                at_cancel = worker()
                answer = await http.post("/v1/requests/long-prefill/cancel")
                assert answer.status_code == 200, answer.text
                await trio.testing.wait_all_tasks_blocked()  # its Cancel is queued
                prefilling.open()
            decoding.cancel_scope.cancel()  # the decoder's client leaves: its stream ends
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "lanes back")
        after, confirmed = worker(), engine.statistics().cancellations
        metrics = (await http.get("/metrics")).text
    prefilled = at_cancel.prompt_tokens_processed - before.prompt_tokens_processed
    assert 16 <= prefilled < len(prompt) - 16, prefilled  # mid-prefill when cancelled
    [raised] = outcome
    assert isinstance(raised, openai.ConflictError)
    assert raised.response.headers["x-should-retry"] == "false"
    validate_error(raised.response.json())
    _assert_cancel_error(raised.response.json()["error"], "long-prefill")
    # No chunk was launched after the cancel reached the engine thread: only the one in
    # flight (the step the gate held) ran.
    assert after.prefill_forwards - at_cancel.prefill_forwards <= 1
    assert after.prompt_tokens_processed - at_cancel.prompt_tokens_processed <= 16
    assert confirmed.confirmed == cancels.confirmed + 2  # the long request's, the decoder's
    assert confirmed.steps_in_flight[2:] == cancels.steps_in_flight[2:]  # one step at most
    assert 'request_cancelled_total{cause="cancel",model_name="tiny"} 1.0' in metrics
