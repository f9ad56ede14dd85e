"""Background responses across a server's end: one that a server stopping (its drain) or dying
(kill -9) left behind is failed, never in progress, for the next server on the same store, as
polled and as a resumed stream. The background responses' life on one running server is
tests/http/test_http_responses_background.py's."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import openai
import trio

from mlx_nursery.server import Running
from mlx_nursery.store import ResponsesStore, StoredResponse
from tests.http_helpers import engine_of, eventually, running_server, spawned_server

HOLD = {"ttft": 30}
"""A script whose first token is 30 s away: it holds the one lane until it is cancelled."""


def _client(server: Running, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def _create(script: Any) -> dict[str, Any]:
    """`responses.create` arguments: a background response of the scripted model."""
    return {
        "model": "scripted",
        "input": "Go.",
        "background": True,
        "extra_body": {"script": script},
    }


def _stats(server: Running) -> Any:
    return engine_of(server).statistics()


async def test_a_shutdown_leaves_a_background_response_failed(tmp_path: Path) -> None:
    """A server that stops while a response runs stores it failed (its drain cancels it);
    the next server on the same store tells the same. One left in progress by a process
    that is gone, found after this server started, is settled when it is polled."""
    db = str(tmp_path / "responses.db")
    async with (
        running_server(None, model=["scripted"], responses_db=db, shutdown_grace=0) as first,
        _client(first, "unused") as client,
    ):
        created = await client.responses.create(**_create(HOLD))
        await eventually(lambda: _stats(first).lanes_borrowed == 1, "running")
    async with (
        running_server(None, model=["scripted"], responses_db=db) as second,
        _client(second, "unused") as client,
    ):
        failed = await client.responses.retrieve(created.id)
        left = ResponsesStore(db)  # another process's store, that process gone since
        await left.open()
        body = {**failed.model_dump(mode="json"), "id": "resp_left", "status": "in_progress"}
        await left.put(StoredResponse("resp_left", time.time(), body, [], [], None, "gone"))
        await left.close()
        settled = await client.responses.retrieve("resp_left")
    assert failed.status == "failed" and failed.error is not None
    assert (failed.error.code, "shutting down" in failed.error.message) == ("server_error", True)
    assert settled.status == "failed" and settled.error is not None
    assert "restarted" in settled.error.message


async def test_a_killed_server_leaves_its_background_responses_failed_not_in_progress(
    tmp_path: Path,
) -> None:
    """kill -9 mid-response: nothing stored it failed; the next server on the store does, at
    startup, and a resumed stream ends with that."""
    db = str(tmp_path / "responses.db")
    flags = ("--served-model-name", "tiny", "--responses-db", db)
    async with (
        spawned_server(Path("scripted"), *flags) as (process, port),
        openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0
        ) as client,
    ):
        stream = await client.responses.create(stream=True, **{**_create(HOLD), "model": "tiny"})
        opening = [await stream.__anext__() for _ in range(3)]
        assert opening[2].type == "response.in_progress"
        running = await client.responses.retrieve(opening[0].response.id)
        assert running.status == "in_progress"
        process.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(process.wait)
    async with (
        running_server(None, model=["scripted"], responses_db=db) as server,
        _client(server, "unused") as client,
    ):
        failed = await client.responses.retrieve(running.id)
        resumed = await client.responses.retrieve(running.id, stream=True, starting_after=2)
        tail = [event async for event in resumed]
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error" and "restarted" in failed.error.message
    assert [e.type for e in tail] == ["response.failed"] and tail[0].sequence_number == 3
