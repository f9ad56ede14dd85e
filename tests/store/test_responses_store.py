"""The Responses store, the same tests for each backend: SQLite (a file) and PostgreSQL (a
real server, tests/postgres.py). Then what only PostgreSQL has: schema creation raced by
several processes, reconnecting after a lost connection, and its password kept out of
every message."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mlx_nursery.store import (
    ResponsesStorage,
    StoredResponse,
    StoreLimits,
    StoreUnavailable,
    responses_store_at,
)
from tests.postgres import PASSWORD, PostgresServer


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives: a SQLite file, or a fresh PostgreSQL database (by URL)."""
    if request.param == "sqlite":
        return str(tmp_path / "responses.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.url(server.new_database())


def _store(location: str, **limits: Any) -> ResponsesStorage:
    limits = {"max_responses": 100, "max_age_seconds": 3600.0, **limits}
    return responses_store_at(location, StoreLimits(**limits))


class _Opened:
    """Stores opened in a test, closed at its end."""

    def __init__(self) -> None:
        self.stores: list[ResponsesStorage] = []

    async def __call__(self, location: str, **limits: Any) -> ResponsesStorage:
        store = _store(location, **limits)
        await store.open()
        self.stores.append(store)
        return store


@pytest.fixture
async def opened() -> Any:
    stores = _Opened()
    yield stores
    for store in stores.stores:
        await store.close()


def _record(n: int, created_at: float | None = None) -> StoredResponse:
    return StoredResponse(
        f"resp_{n}",
        time.time() if created_at is None else created_at,
        {"id": f"resp_{n}", "object": "response", "output": [{"text": f"answer {n}"}]},
        [{"id": f"msg_{n}", "type": "message", "content": f"question {n}"}],
        [{"role": "user", "content": f"question {n}"}],
    )


def _newest_first(n: int) -> Iterator[StoredResponse]:
    now = time.time()
    return (_record(i, now - 1000 + i) for i in range(n))


async def test_a_response_round_trips_exactly(location: str, opened: _Opened) -> None:
    store = await opened(location)
    # Key order, a NUL, astral and escaped characters, nesting: what JSON columns could lose.
    body = {"z": 1, "a": ["\x00", "日本", "😀", 'q"\\'], "m": {"y": None, "b": 1.5, "t": True}}
    record = StoredResponse("resp_x", time.time() - 0.5, body, [{"k": 2}], [{"r": "x"}])
    await store.put(record)
    got = await store.get("resp_x")
    assert got == record
    assert got is not None
    assert list(got.body) == ["z", "a", "m"] and list(got.body["m"]) == ["y", "b", "t"]
    assert await store.get("resp_missing") is None


async def test_put_replaces_and_delete_says_whether_it_was_there(
    location: str, opened: _Opened
) -> None:
    store = await opened(location)
    await store.put(_record(1))
    replaced = StoredResponse("resp_1", time.time(), {"v": 2}, [], [])
    await store.put(replaced)
    assert await store.get("resp_1") == replaced
    assert await store.delete("resp_1") is True
    assert await store.get("resp_1") is None
    assert await store.delete("resp_1") is False


async def test_the_oldest_past_max_responses_are_evicted(location: str, opened: _Opened) -> None:
    store = await opened(location, max_responses=3)
    records = list(_newest_first(5))
    for record in reversed(records):  # put newest first: eviction goes by age, not by order
        await store.put(record)
    kept = [await store.get(record.id) for record in records]
    assert kept == [None, None, *records[2:]]


async def test_responses_past_max_age_are_not_returned_and_are_evicted(
    location: str, opened: _Opened
) -> None:
    strict = await opened(location, max_age_seconds=60)
    lenient = await opened(location, max_age_seconds=3600)
    old = _record(1, time.time() - 120)
    await lenient.put(old)
    assert await lenient.get(old.id) == old
    assert await strict.get(old.id) is None  # too old for it, though still stored
    await strict.put(_record(2))  # a put evicts what its limits say is too old
    assert await lenient.get(old.id) is None
    assert await lenient.get("resp_2") is not None


async def test_a_second_store_on_the_same_location_shares_everything(
    location: str, opened: _Opened
) -> None:
    """Two processes (here, two stores with their own connections) naming one database."""
    first, second = await opened(location), await opened(location)
    await first.put(_record(1))
    assert await second.get("resp_1") == await first.get("resp_1") is not None
    assert await second.delete("resp_1") is True
    assert await first.get("resp_1") is None


async def test_concurrent_writers_keep_the_count_limit(location: str, opened: _Opened) -> None:
    """Puts from two stores at once, round after round: each put's eviction sees the other's
    row, so after every round exactly the newest `max_responses` remain (PostgreSQL: the
    puts' advisory lock; without it both evict the same oldest row, one too few)."""
    limit = 3
    stores = [await opened(location, max_responses=limit) for _ in range(2)]
    records = list(_newest_first(60))
    for start in range(0, len(records), 2):
        async with trio.open_nursery() as nursery:
            for store, record in zip(stores, records[start : start + 2], strict=True):
                nursery.start_soon(store.put, record)
        so_far = records[: start + 2]
        kept = [record.id for record in so_far if await stores[0].get(record.id) is not None]
        assert kept == [record.id for record in so_far[-limit:]], f"after round {start // 2}"


async def test_a_put_cancelled_before_its_thread_starts_writes_nothing(
    location: str, opened: _Opened
) -> None:
    store = await opened(location)
    with trio.CancelScope() as scope:
        scope.cancel()
        await store.put(_record(1))
    assert scope.cancelled_caught
    assert await store.get("resp_1") is None


async def test_a_closed_store_refuses_calls(location: str) -> None:
    store = _store(location)
    await store.open()
    await store.close()
    with pytest.raises(RuntimeError, match="not open"):
        await store.get("resp_1")


# -- PostgreSQL only -------------------------------------------------------------------------


async def test_postgres_schema_creation_is_safe_when_processes_start_at_once(
    postgres: PostgresServer, opened: _Opened
) -> None:
    """Many stores open on one fresh database at once (each its own thread and connection):
    every one succeeds, where bare CREATE TABLE IF NOT EXISTS races on the catalog."""
    for _ in range(3):
        url = postgres.url(postgres.new_database())
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(opened, url)
        await opened.stores[-1].put(_record(1))
        assert all([await store.get("resp_1") is not None for store in opened.stores[-8:]])


async def test_postgres_reconnects_after_losing_its_connection(
    postgres: PostgresServer, opened: _Opened
) -> None:
    database = postgres.new_database()
    store = await opened(postgres.url(database))
    await store.put(_record(1))
    # A cut connection (a server restart, a proxy's idle timeout) is replaced on use.
    assert postgres.cut_connections(database) == 1
    assert await store.get("resp_1") == await store.get("resp_1") is not None
    # With the database unreachable, calls fail; once it is back, the next call succeeds.
    postgres.allow_connections(database, False)
    try:
        assert postgres.cut_connections(database) == 1
        with pytest.raises(StoreUnavailable) as failed:
            await store.put(_record(2))
        assert PASSWORD not in str(failed.value)
        with pytest.raises(StoreUnavailable):
            await store.get("resp_1")
    finally:
        postgres.allow_connections(database, True)
    await store.put(_record(2))
    assert await store.get("resp_2") is not None and await store.get("resp_1") is not None


async def test_postgres_failures_at_open_never_show_the_password(
    postgres: PostgresServer,
) -> None:
    database = postgres.new_database()
    for url in (
        postgres.url(database, password="wrong-" + PASSWORD),  # refused by the server
        postgres.url("no_such_database"),  # refused once the password is taken
        postgres.url(database, password=PASSWORD + "%zz"),  # libpq's parse error quotes it
    ):
        store = _store(url)
        assert PASSWORD not in store.path and "nursery@" in store.path
        with pytest.raises(StoreUnavailable) as failed:
            await store.open()
        assert PASSWORD not in str(failed.value), str(failed.value)
        assert failed.value.__cause__ is None and failed.value.__suppress_context__
