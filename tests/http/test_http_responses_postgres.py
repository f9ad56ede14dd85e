"""/v1/responses with a PostgreSQL store through real servers: replicas behind a load
balancer share responses (a committed one outlives kill -9 of the process that stored it),
a store that fails answers in OpenAI's envelope and recovers, and its URL's password is
never logged."""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import openai
import pytest
import trio

from mlx_nursery.server import serve
from mlx_nursery.settings import Settings
from tests.http_helpers import _spawn_server, running_server, validate_error
from tests.postgres import PASSWORD, PostgresServer


@asynccontextmanager
async def _replicas(
    model: Path, url: str, count: int
) -> AsyncIterator[list[tuple[subprocess.Popen[str], openai.AsyncOpenAI]]]:
    """`count` `mlx-nursery serve` processes on one store, started at once; killed at the end."""
    flags = ("--served-model-name", "tiny", "--responses-db", url, "--skip-warmup")
    spawned: list[tuple[subprocess.Popen[str], int]] = []

    async def spawn() -> None:
        spawned.append(await trio.to_thread.run_sync(lambda: _spawn_server(model, *flags)))

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(spawn)
        clients = [
            openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
            for _, port in spawned
        ]
        yield [(process, client) for (process, _), client in zip(spawned, clients, strict=True)]
        for client in clients:
            await client.close()
    finally:
        for process, _ in spawned:
            if process.poll() is None:
                process.kill()
            await trio.to_thread.run_sync(process.wait)
            assert process.stderr is not None
            process.stderr.close()


async def test_two_server_processes_share_responses_and_outlive_a_kill_9(
    tiny_model: Path, postgres: PostgresServer
) -> None:
    """Replicas behind a load balancer: whichever process a request reaches, it finds what
    another stored. (One test, two processes: starting them is most of its time.)"""
    url = postgres.url(postgres.new_database())
    async with _replicas(tiny_model, url, 2) as [(process_a, a), (_, b)]:
        first = await a.responses.create(
            model="tiny", input="Name a colour.", instructions="Be brief.", max_output_tokens=3
        )
        # The follow-up lands on the other process: it finds the conversation there.
        second = await b.responses.create(
            model="tiny", previous_response_id=first.id, input="Another?", max_output_tokens=3
        )
        assert second.previous_response_id == first.id
        assert second.usage is not None and first.usage is not None
        assert second.usage.input_tokens > first.usage.input_tokens
        assert (await a.responses.retrieve(second.id)).output_text == second.output_text
        assert (await b.responses.retrieve(first.id)).output_text == first.output_text
        items = await a.responses.input_items.list(second.id)
        assert [item.type for item in items.data] == ["message"]

        await b.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            await a.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            await a.responses.create(model="tiny", previous_response_id=first.id, input="x")

        # Concurrent writers from both processes: every response is stored, seen by both.
        ids: list[str] = []

        async def create(client: openai.AsyncOpenAI, i: int) -> None:
            ids.append(
                (await client.responses.create(model="tiny", input=f"n{i}", max_output_tokens=2)).id
            )

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(create, (a, b)[i % 2], i)
        assert len(set(ids)) == 8
        for response_id in ids:
            assert (await a.responses.retrieve(response_id)).id == response_id
            assert (await b.responses.retrieve(response_id)).id == response_id

        # A response is committed before its answer: kill -9 right after, the other serves it.
        created = await a.responses.create(model="tiny", input="keep me", max_output_tokens=3)
        process_a.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(process_a.wait)
        kept = await b.responses.retrieve(created.id)
        assert kept.id == created.id and kept.output_text == created.output_text
        follow = await b.responses.create(
            model="tiny", previous_response_id=created.id, input="more", max_output_tokens=2
        )
        assert follow.previous_response_id == created.id


async def test_a_failing_store_answers_500_in_the_envelope_then_recovers(
    tiny_model: Path, postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    database = postgres.new_database()
    async with (
        running_server(tiny_model, responses_db=postgres.url(database)) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        created = await http.post(
            "/v1/responses", json={"model": "tiny", "input": "x", "max_output_tokens": 2}
        )
        assert created.status_code == 200
        response_id = created.json()["id"]
        postgres.allow_connections(database, False)
        try:
            postgres.cut_connections(database)
            failures = [
                await http.get(f"/v1/responses/{response_id}"),
                await http.delete(f"/v1/responses/{response_id}"),
                await http.post(
                    "/v1/responses",
                    json={"model": "tiny", "input": "y", "previous_response_id": response_id},
                ),
                await http.post(
                    "/v1/responses", json={"model": "tiny", "input": "z", "max_output_tokens": 2}
                ),
            ]
        finally:
            postgres.allow_connections(database, True)
        for failure in failures:
            assert failure.status_code == 500, failure.text
            validate_error(failure.json())
            assert failure.json()["error"]["code"] == "internal_error"
            assert "Traceback" not in failure.text and "psycopg" not in failure.text
        # The database is back: the next calls reconnect.
        assert (await http.get(f"/v1/responses/{response_id}")).status_code == 200
        assert (await http.delete(f"/v1/responses/{response_id}")).status_code == 200
    assert PASSWORD not in caplog.text


async def test_a_postgres_store_that_cannot_open_fails_the_server_without_its_password(
    tiny_model: Path, postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    url = postgres.url(postgres.new_database(), password="wrong-" + PASSWORD)
    settings = Settings(model=str(tiny_model), port=0, responses_db=url, shutdown_grace=1.0)
    assert await serve(settings, handle_signals=False) == 1
    assert f"the responses store at postgresql://nursery@127.0.0.1:{postgres.port}/" in caplog.text
    assert "password authentication failed" in caplog.text
    assert PASSWORD not in caplog.text
