"""Background responses (`background: true`) through a real server and the official SDK: queued
at once, polled to their end, cancelled (queued, before the first token, mid-decode) with the
engine's counters showing the compute stopped, outliving the request that made them (a
streamed one too, its stream closed by its creator), streamed live and resumed after any
event, kept apart per key, and bounded. Never left in progress by a server that stopped or
died: tests/http/test_http_responses_restarts.py.

One scripted-model server (one lane, two keys) serves the module; each test leaves it idle.
Long generations are the script's waits (`ttft`, `stalls`): they are there to be cut short,
so no test waits them out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
import trio

from mlx_nursery.server import Running
from tests.http_helpers import (
    engine_of,
    eventually,
    post_request,
    raw_http,
    read_until,
    server_thread,
    validate,
    validate_error,
)

KEYS = ("key-a", "key-b")
SETTINGS: dict[str, Any] = {
    "model": ["scripted"],
    "max_concurrency": 1,
    "api_key": KEYS,
    "max_background": 3,
    "max_background_per_key": 2,
}
UNFINISHED = ("queued", "in_progress")
HOLD = {"ttft": 30}
"""A script whose first token is 30 s away: it holds the one lane until it is cancelled."""
CHUNKS = ["one", " two", " three", " four", " five"]
STALLED = {"output": {"chunks": CHUNKS}, "stalls": [{"at": 2, "seconds": 30}]}
"""Two pieces, then a 30 s stall before the third: mid-decode until cancelled."""


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with server_thread(None, **SETTINGS) as served:
        yield served.running


@pytest.fixture
async def client(server: Running) -> AsyncIterator[openai.AsyncOpenAI]:
    async with _client(server, KEYS[0]) as sdk:
        yield sdk
    await eventually(lambda: engine_of(server).statistics().lanes_borrowed == 0, "lanes back")


def _client(server: Running, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def _create(script: Any = None, **fields: Any) -> dict[str, Any]:
    """`responses.create` arguments: a background response of the scripted model."""
    arguments: dict[str, Any] = {"model": "scripted", "input": "Go.", "background": True}
    if script is not None:
        arguments["extra_body"] = {"script": script}
    return {**arguments, **fields}


def _stats(server: Running) -> Any:
    return engine_of(server).statistics()


def _generated(server: Running) -> int:
    worker = _stats(server).worker
    return worker.generated_tokens if worker else 0


def _compute(server: Running) -> tuple[int, int, int]:
    """The engine's counters of what ran: tokens generated, cancels confirmed, and cancels
    confirmed more than a step after they were asked (the server's guarantee: none)."""
    cancels = _stats(server).cancellations
    return _generated(server), cancels.confirmed, sum(cancels.steps_in_flight[2:])


def _tokens(server: Running, *texts: str) -> int:
    encode = engine_of(server).model.tokenizer.encode
    return sum(len(encode(text)) for text in texts)


async def _ended(client: openai.AsyncOpenAI, response_id: str) -> Any:
    """The response once it has ended (polled, as a client polls)."""
    with trio.fail_after(60):
        response = await client.responses.retrieve(response_id)
        while response.status in UNFINISHED:
            await trio.sleep(0.01)
            response = await client.responses.retrieve(response_id)
    return response


def _body(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = response.model_dump(mode="json", exclude_unset=True, warnings=False)
    validate(body, "Response")
    return body


async def test_a_background_response_is_queued_then_polled_to_its_end(
    server: Running, client: openai.AsyncOpenAI
) -> None:
    created = await client.responses.create(**_create({"output": {"chunks": CHUNKS}}))
    body = _body(created)
    assert body["status"] in ("queued", "in_progress") and body["background"] is True
    assert body["output"] == [] and "usage" not in body

    done = await _ended(client, created.id)
    assert _body(done)["background"] is True and done.status == "completed"
    assert done.output_text == "".join(CHUNKS)
    assert done.usage is not None and done.usage.output_tokens >= len(CHUNKS)
    assert done.error is None

    cut = await client.responses.create(
        **_create({"output": {"chunks": CHUNKS}}, max_output_tokens=2)
    )
    incomplete = await _ended(client, cut.id)
    assert incomplete.status == "incomplete" and incomplete.incomplete_details is not None
    assert incomplete.incomplete_details.reason == "max_output_tokens"

    # Background responses are stored: OpenAI refuses `store: false` with them.
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(**_create(store=False))
    validate_error({"error": refused.value.body})
    assert refused.value.param == "background"  # type: ignore[attr-defined]


async def test_cancel_while_queued_and_before_the_first_token_stops_the_compute(
    server: Running, client: openai.AsyncOpenAI
) -> None:
    generated, confirmed, late = _compute(server)
    holder = await client.responses.create(**_create(HOLD))  # takes the one lane
    await eventually(lambda: _stats(server).lanes_borrowed == 1, "the holder has the lane")
    queued = await client.responses.create(**_create({"output": {"text": "never"}}))
    assert (await client.responses.retrieve(queued.id)).status == "queued"
    await eventually(lambda: _stats(server).queued == 1, "the second waits for the lane")

    cancelled = await client.responses.cancel(queued.id)
    assert _body(cancelled)["status"] == "cancelled" and cancelled.output == []
    assert _stats(server).queued == 0
    assert (await client.responses.retrieve(queued.id)).status == "cancelled"
    # Cancelling it again gives it as it is.
    again = await client.responses.cancel(queued.id)
    assert again.model_dump() == cancelled.model_dump()

    # The holder waits for its first token (admitted, computing nothing yet): cancelled, the
    # engine confirms within a step and the lane is back.
    assert (await client.responses.retrieve(holder.id)).status == "in_progress"
    stopped = await client.responses.cancel(holder.id)
    assert stopped.status == "cancelled"
    assert _compute(server) == (generated, confirmed + 1, late)  # the holder's cancel alone
    assert _stats(server).lanes_borrowed == 0 and _stats(server).late_events == 0


async def test_cancel_mid_decode_stops_within_a_step_and_keeps_the_output_so_far(
    server: Running, client: openai.AsyncOpenAI
) -> None:
    generated, confirmed, late = _compute(server)
    created = await client.responses.create(**_create(STALLED))
    two = _tokens(server, *CHUNKS[:2])
    await eventually(lambda: _generated(server) == generated + two, "two pieces, then the stall")

    cancelled = await client.responses.cancel(created.id)
    body = _body(cancelled)
    assert body["status"] == "cancelled" and "usage" not in body
    assert cancelled.output_text == "".join(CHUNKS[:2])
    assert _compute(server) == (generated + two, confirmed + 1, late)  # stopped within a step
    assert _stats(server).lanes_borrowed == 0 and _stats(server).late_events == 0
    assert (await client.responses.retrieve(created.id)).model_dump() == cancelled.model_dump()

    # What cannot be cancelled: a response that ended otherwise, one made in the foreground.
    done = await client.responses.create(**_create({"output": {"text": "done"}}))
    assert (await _ended(client, done.id)).status == "completed"
    foreground = await client.responses.create(model="scripted", input="Hi.")
    for response_id, message in [
        (done.id, "Cannot cancel a completed response."),
        (foreground.id, "Cannot cancel a synchronous response."),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.cancel(response_id)
        assert refused.value.body["message"] == message  # type: ignore[index]
        assert refused.value.body["param"] == "response_id"  # type: ignore[index]


async def test_a_background_response_outlives_the_request_that_made_it(
    server: Running, client: openai.AsyncOpenAI
) -> None:
    """The creating request is gone (its connection closed) while the response still waits
    for the lane; it then runs to its end."""
    holder = await client.responses.create(**_create(HOLD))
    await eventually(lambda: _stats(server).lanes_borrowed == 1, "the holder has the lane")
    body = {**_create({"output": {"chunks": CHUNKS}}), "script": {"output": {"chunks": CHUNKS}}}
    del body["extra_body"]
    port = int(server.base_url.rsplit(":", 1)[1])
    request = post_request("/v1/responses", body).replace(
        b"Content-Type", f"Authorization: Bearer {KEYS[0]}\r\nContent-Type".encode(), 1
    )
    connection = await raw_http(port, request)
    answer = await read_until(connection, b'"status": "queued"')
    response_id = answer.split(b'"id": "', 1)[1].split(b'"', 1)[0].decode()
    await connection.aclose()

    await client.responses.cancel(holder.id)  # the lane frees: the orphan runs now
    done = await _ended(client, response_id)
    assert (done.status, done.output_text) == ("completed", "".join(CHUNKS))


async def test_a_streamed_response_whose_creator_left_runs_on_and_replays_the_rest(
    server: Running, client: openai.AsyncOpenAI
) -> None:
    """Its stream closed by its creator while it waits for the lane, it runs to its end
    unread; a resumed stream gives every event the creator missed."""
    holder = await client.responses.create(**_create(HOLD))
    await eventually(lambda: _stats(server).lanes_borrowed == 1, "the holder has the lane")
    stream = await client.responses.create(stream=True, **_create({"output": {"chunks": CHUNKS}}))
    seen = [await stream.__anext__() for _ in range(2)]
    await stream.close()  # the creator disconnects
    assert [e.type for e in seen] == ["response.created", "response.queued"]
    await client.responses.cancel(holder.id)  # the lane frees: the response runs unread
    done = await _ended(client, seen[0].response.id)
    assert (done.status, done.output_text) == ("completed", "".join(CHUNKS))
    resumed = await client.responses.retrieve(done.id, stream=True, starting_after=1)
    rest = [event async for event in resumed]
    assert [e.sequence_number for e in rest] == list(range(2, 2 + len(rest)))
    assert rest[0].type == "response.in_progress" and rest[-1].type == "response.completed"
    assert rest[-1].response.model_dump() == done.model_dump()
    deltas = [e.delta for e in rest if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "".join(CHUNKS)


async def test_a_stream_resumes_after_any_event_then_goes_on_live(
    server: Running, client: openai.AsyncOpenAI
) -> None:
    stream = await client.responses.create(stream=True, **_create({"output": {"chunks": CHUNKS}}))
    events = [event async for event in stream]
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))
    assert [e.type for e in events[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert events[0].response.status == "queued" and events[-1].type == "response.completed"
    response_id = events[0].response.id
    for after in (-1, 0, 1, 4, len(events) - 2, len(events) - 1, len(events) + 5):
        resumed = await client.responses.retrieve(response_id, stream=True, starting_after=after)
        again = [event async for event in resumed]
        assert [e.model_dump() for e in again] == [e.model_dump() for e in events[after + 1 :]]

    # Resumed while it runs: what was stored, then the rest as it comes (here: its cancel).
    generated = _generated(server)
    live = await client.responses.create(stream=True, **_create(STALLED))
    first = [await live.__anext__() for _ in range(3)]
    live_id = first[0].response.id
    resumed = await client.responses.retrieve(live_id, stream=True, starting_after=1)
    seen = [await resumed.__anext__()]
    assert seen[0].model_dump() == first[2].model_dump()
    two = _tokens(server, *CHUNKS[:2])
    await eventually(lambda: _generated(server) == generated + two, "two pieces, then the stall")
    cancelled = await client.responses.cancel(live_id)
    seen += [event async for event in resumed]
    tail = [event async for event in live]
    assert [e.model_dump() for e in seen[1:]] == [e.model_dump() for e in tail]
    assert seen[-1].type == "response.failed" and seen[-1].response.status == "cancelled"
    assert seen[-1].response.model_dump() == cancelled.model_dump()
    assert "".join(e.delta for e in seen if e.type == "response.output_text.delta") == "".join(
        CHUNKS[:2]
    )

    # Only a background response made with stream: true streams again.
    polled = await client.responses.create(**_create({"output": {"text": "x"}}))
    assert (await _ended(client, polled.id)).status == "completed"
    foreground = await client.responses.create(model="scripted", input="Hi.")
    async with httpx.AsyncClient(
        base_url=server.base_url, headers={"Authorization": f"Bearer {KEYS[0]}"}
    ) as http:
        for response_id, needs in [(polled.id, "stream=true"), (foreground.id, "background=true")]:
            refused = await http.get(f"/v1/responses/{response_id}?stream=true")
            assert refused.status_code == 400, refused.text
            validate_error(refused.json())
            assert needs in refused.json()["error"]["message"]
            assert refused.json()["error"]["param"] == "stream"
        bad = await http.get(f"/v1/responses/{live_id}?stream=true&starting_after=x")
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "starting_after")


async def test_another_key_cannot_see_or_cancel_a_background_response(
    server: Running, client: openai.AsyncOpenAI
) -> None:
    created = await client.responses.create(**_create(HOLD, stream=False))
    async with _client(server, KEYS[1]) as other:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.cancel(created.id)
        with pytest.raises(openai.NotFoundError):
            async for _ in await other.responses.retrieve(created.id, stream=True):
                pass
    assert (await client.responses.retrieve(created.id)).status == "in_progress"
    with pytest.raises(openai.BadRequestError):  # an in-flight response is not deleted
        await client.responses.delete(created.id)
    await client.responses.cancel(created.id)
    await client.responses.delete(created.id)


async def test_background_responses_are_capped_per_key_and_server_wide(
    server: Running, client: openai.AsyncOpenAI
) -> None:
    """Two per key, three in all (the module's settings): past either, 429 at once, and
    nothing runs for the refused request."""
    mine = [await client.responses.create(**_create(HOLD)) for _ in range(2)]
    with pytest.raises(openai.RateLimitError) as refused:
        await client.responses.create(**_create(HOLD))
    assert "--max-background-per-key" in refused.value.message
    async with _client(server, KEYS[1]) as other:
        theirs = await other.responses.create(**_create(HOLD))
        with pytest.raises(openai.RateLimitError) as full:
            await other.responses.create(**_create(HOLD))
        assert "--max-background" in full.value.message
        assert full.value.response.headers["retry-after"] == "1"
        await other.responses.cancel(theirs.id)
    for response in mine:
        assert (await client.responses.cancel(response.id)).status == "cancelled"
    again = await client.responses.create(**_create({"output": {"text": "room again"}}))
    assert (await _ended(client, again.id)).output_text == "room again"
