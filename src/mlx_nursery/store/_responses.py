"""The Responses store: SQLite through the standard library, never on the Trio thread.

Each stored response keeps its full conversation (the chat messages a follow-up replays),
so `previous_response_id` is one lookup: no chain to walk, no cycle possible (ids are ours
and a response can only point at one stored before it). WAL mode and a commit per write:
a committed response survives the process being killed. Every call runs in a worker
thread, one at a time (a limiter of 1), on one connection.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from .. import fault_points

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    body TEXT NOT NULL,
    input_items TEXT NOT NULL,
    conversation TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created_at ON responses (created_at);
"""


@attrs.frozen
class StoredResponse:
    id: str
    created_at: float
    body: dict[str, Any]
    """The response object as returned to the client."""
    input_items: list[dict[str, Any]]
    """This turn's input items, with ids (for /input_items)."""
    conversation: list[dict[str, Any]]
    """Chat messages up to and including this response's output (instructions excluded)."""


class ResponsesStore:
    """Stored responses in SQLite, every call on a worker thread, one at a time.

    Cancellation, for every method: each is a checkpoint. Cancelled before its thread starts
    (on entry, or while another call holds the one thread), it does nothing and raises
    `Cancelled`. Once its thread runs, it is not abandoned (`trio.to_thread.run_sync`'s
    default): the call completes, a write is committed (or rolled back if it failed), and
    the method returns its result as usual; the cancellation is delivered at the caller's
    next checkpoint. So a `put` under way when its client leaves still stores the response.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_responses: int = 10_000,
        max_age_seconds: float = 30 * 24 * 3600,
    ) -> None:
        self.path = str(path)
        self.max_responses = max_responses
        self.max_age_seconds = max_age_seconds
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
        """Store `record` (replacing one with its id), then evict past the age and count
        limits, in one transaction. Cancelled before its thread ran: nothing was written."""
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

    async def _run(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` on the store's thread; never abandoned once started (class docstring)."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -- on the worker thread ---------------------------------------------------------------
    def _open(self) -> None:
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
        db.executescript(_SCHEMA)
        self._db = db

    def _put(self, record: StoredResponse) -> None:
        db = self._require()
        with _transaction(db):
            db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.created_at,
                    json.dumps(record.body),
                    json.dumps(record.input_items),
                    json.dumps(record.conversation),
                ),
            )
            db.execute(
                "DELETE FROM responses WHERE created_at < ?", (time.time() - self.max_age_seconds,)
            )
            db.execute(
                "DELETE FROM responses WHERE id IN (SELECT id FROM responses "
                "ORDER BY created_at DESC LIMIT -1 OFFSET ?)",
                (self.max_responses,),
            )

    def _get(self, response_id: str) -> StoredResponse | None:
        row = (
            self._require()
            .execute(
                "SELECT id, created_at, body, input_items, conversation"
                " FROM responses WHERE id = ?",
                (response_id,),
            )
            .fetchone()
        )
        if row is None or row[1] < time.time() - self.max_age_seconds:
            return None
        return StoredResponse(
            row[0], row[1], json.loads(row[2]), json.loads(row[3]), json.loads(row[4])
        )

    def _delete(self, response_id: str) -> bool:
        with _transaction(self._require()) as db:
            return db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

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
