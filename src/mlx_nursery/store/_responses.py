"""The Responses store: SQLite through the standard library, never on the Trio thread.

Each stored response keeps its full conversation (the chat messages a follow-up replays),
so `previous_response_id` is one lookup: no chain to walk, no cycle possible (ids are ours
and a response can only point at one stored before it). WAL mode and a commit per write:
a committed response survives the process being killed. Every call runs in a worker
thread, one at a time (a limiter of 1), on one connection. The rows, their owners, limits,
large strings kept once and events are `_rows.py`'s, shared with PostgreSQL.

A SQLite store serves one server process: a response left unfinished by another `runner`
than this store's was left by a process that is gone (`unfinished`).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from .. import fault_points
from ._rows import (
    Dialect,
    StoredResponse,
    StoreLimits,
    append_events,
    delete,
    numbered,
    read,
    read_events,
    unfinished,
    write,
)

T = TypeVar("T")

_DIALECT = Dialect("responses", "response_blobs", "response_blob_refs", "response_events", "?")

_TABLE = """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    owner TEXT NOT NULL DEFAULT '',
    runner TEXT NOT NULL DEFAULT '',
    bytes INTEGER NOT NULL DEFAULT 0,
    body TEXT NOT NULL,
    input_items TEXT NOT NULL,
    conversation TEXT NOT NULL
)"""

_ADDED_COLUMNS = {
    "owner": "owner TEXT NOT NULL DEFAULT ''",
    "bytes": "bytes INTEGER NOT NULL DEFAULT 0",
    "runner": "runner TEXT NOT NULL DEFAULT ''",
}
"""Columns a database made before them lacks (`_rows.py` says what old rows get)."""


class ResponsesStore:
    """Stored responses in SQLite, every call on a worker thread, one at a time.

    Cancellation, for every method: each is a checkpoint. Cancelled before its thread starts
    (on entry, or while another call holds the one thread), it does nothing and raises
    `Cancelled`. Once its thread runs, it is not abandoned (`trio.to_thread.run_sync`'s
    default): the call completes, a write is committed (or rolled back if it failed), and
    the method returns its result as usual; the cancellation is delivered at the caller's
    next checkpoint. So a `put` under way when its client leaves still stores the response.
    """

    def __init__(self, path: str | Path, limits: StoreLimits | None = None) -> None:
        self.path = str(path)
        self.limits = limits or StoreLimits()
        self.runner = secrets.token_hex(8)
        """This server process, as the responses it runs name it (`StoredResponse.runner`)."""
        self._db: sqlite3.Connection | None = None
        self._limiter = trio.CapacityLimiter(1)

    async def open(self) -> None:
        """Open (or create) the database. Cancelled before its thread ran: still closed."""
        await self._run(self._open)

    async def close(self) -> None:
        """Close the database. Cancelled before its thread ran: still open."""
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None

    async def put(self, record: StoredResponse) -> None:
        """Store `record` (replacing one with its id), then evict past the limits (`_rows.py`),
        in one transaction. Cancelled before its thread ran: nothing was written."""
        fault_points.reach("store_write")
        await self._run(self._put, record)

    async def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None (never stored, deleted, evicted, or too old)."""
        found: StoredResponse | None = await self._run(self._get, response_id)
        return found

    async def delete(self, response_id: str) -> bool:
        """Delete a response; whether it was there. Cancelled before its thread ran: nothing
        was deleted."""
        deleted: bool = await self._run(self._delete, response_id)
        return deleted

    async def append_events(self, response_id: str, events: list[dict[str, Any]]) -> None:
        """Add a streamed response's events (each with its `sequence_number`), if the
        response is still stored. Cancelled before its thread ran: nothing was written."""
        await self._run(self._append, response_id, numbered(events))

    async def events(self, response_id: str, after: int) -> list[dict[str, Any]]:
        """The response's stored events numbered past `after`, in order."""
        found: list[str] = await self._run(self._events, response_id, after)
        return [json.loads(event) for event in found]

    async def unfinished(self) -> list[str]:
        """The responses left unfinished by a server process that is gone: every one not
        this store's `runner`'s (a SQLite store serves one process)."""
        found: list[tuple[str, str]] = await self._run(self._unfinished)
        return [response_id for response_id, runner in found if runner != self.runner]

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the store's thread; never abandoned once started (class docstring)."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -- on the worker thread ---------------------------------------------------------------
    def _open(self) -> None:
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
        with _transaction(db):  # one schema change, whichever process opens first
            db.execute(_TABLE)
            columns = {row[1] for row in db.execute("PRAGMA table_info(responses)")}
            for name, definition in _ADDED_COLUMNS.items():
                if name not in columns:
                    db.execute(f"ALTER TABLE responses ADD COLUMN {definition}")
            for statement in _DIALECT.schema():
                db.execute(statement)
        self._db = db

    def _put(self, record: StoredResponse) -> None:
        with _transaction(self._require()) as db:
            write(db, _DIALECT, record, self.limits)

    def _get(self, response_id: str) -> StoredResponse | None:
        return read(self._require(), _DIALECT, response_id, self.limits.max_age_seconds)

    def _delete(self, response_id: str) -> bool:
        with _transaction(self._require()) as db:
            return delete(db, _DIALECT, response_id)

    def _append(self, response_id: str, events: list[tuple[int, str]]) -> None:
        with _transaction(self._require()) as db:
            append_events(db, _DIALECT, response_id, events)

    def _events(self, response_id: str, after: int) -> list[str]:
        return read_events(self._require(), _DIALECT, response_id, after)

    def _unfinished(self) -> list[tuple[str, str]]:
        return unfinished(self._require(), _DIALECT)

    def _require(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the responses store is not open")
        return self._db


class _transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: object, *_: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")
