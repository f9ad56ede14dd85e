"""The Responses store in PostgreSQL, shared by every server process that names the database.

The rows, limits and cancellation behaviour are SQLite's (`_responses.py`, `_rows.py`): the
JSON columns are text holding `json.dumps`'s output, so a body comes back byte for byte as
SQLite gives it (jsonb would reorder its keys and refuse `\\u0000`). psycopg's async API
runs only on asyncio, so the sync API runs on a worker thread, one call at a time, on one
connection per process; each write is its own committed transaction.

Several processes at once:
- Schema creation takes a transaction-scoped advisory lock: `CREATE TABLE IF NOT EXISTS`
  run by two sessions at once can fail on a unique index of the catalog.
- Each put and delete takes another advisory lock for its transaction, so writes from every
  process are serialized as SQLite's `BEGIN IMMEDIATE` serializes them: two concurrent
  prunes would each miss the other's row, leaving the table past its limits, and a delete
  collecting a large string could race a put that references it again.

A lost connection (a server restart, an idle connection cut) is found when a call uses it:
the call is retried once on a new connection; a call that fails on a new connection raises
(the route's error handler answers 500 in OpenAI's envelope) and the next call connects
again, so the store never stays failed.

Which process is alive: each store holds, on its connection, a session advisory lock named
by its `runner` (taken again on every new connection). A response left unfinished by a
runner whose lock no session holds was left by a process that is gone (`unfinished`); one
whose runner holds its lock is running elsewhere and is left alone.

The URL's password is never in a message we make: `path` leaves it out, and errors at open
are scrubbed of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit

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

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import TupleRow

T = TypeVar("T")
A = TypeVar("A")

SCHEMES = ("postgresql://", "postgres://")

_TABLE = "mlx_nursery_responses"
"""Prefixed: the database may be shared with other applications."""

_DIALECT = Dialect(_TABLE, f"{_TABLE}_blobs", f"{_TABLE}_blob_refs", f"{_TABLE}_events", "%s")

_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {_TABLE} (
        id TEXT PRIMARY KEY,
        created_at DOUBLE PRECISION NOT NULL,
        owner TEXT NOT NULL DEFAULT '',
        runner TEXT NOT NULL DEFAULT '',
        bytes BIGINT NOT NULL DEFAULT 0,
        body TEXT NOT NULL,
        input_items TEXT NOT NULL,
        conversation TEXT NOT NULL
    )""",
    # A table made before these columns (`_rows.py` says what old rows get):
    f"ALTER TABLE {_TABLE} ADD COLUMN IF NOT EXISTS owner TEXT NOT NULL DEFAULT ''",
    f"ALTER TABLE {_TABLE} ADD COLUMN IF NOT EXISTS bytes BIGINT NOT NULL DEFAULT 0",
    f"ALTER TABLE {_TABLE} ADD COLUMN IF NOT EXISTS runner TEXT NOT NULL DEFAULT ''",
    *_DIALECT.schema(),
)


def _lock_key(name: str) -> int:
    """A bigint advisory lock key of our own (advisory keys are shared by every client of
    the database: a hash of a name of ours is unlikely to be anyone else's)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


_SCHEMA_LOCK = _lock_key("mlx-nursery responses schema")
_WRITE_LOCK = _lock_key("mlx-nursery responses write")


def _runner_lock(runner: str) -> int:
    """The session lock a live runner holds (module docstring)."""
    return _lock_key(f"mlx-nursery responses runner {runner}")


_CONNECTION_DEFAULTS: dict[str, Any] = {  # keyword arguments of psycopg.connect
    "application_name": "mlx-nursery",
    "connect_timeout": 10,
    # A server that vanishes (no reset) is found within about a minute, not TCP's hours:
    # the worker thread, and every store call queued behind it, waits at most that long.
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}
"""What the URL does not set itself."""


def is_postgres_url(location: str) -> bool:
    return location.startswith(SCHEMES)


def shown_url(url: str) -> str:
    """`url` for messages: scheme, user, host, port and database; never the password (nor
    the query, which may carry one)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return f"{parts.scheme}://(a URL that does not parse)"
    if "@" in parts.path or ":" in parts.path:  # an unencoded '/' in the password cut it
        return f"{parts.scheme}://(a URL that does not parse)"
    user = f"{parts.username}@" if parts.username else ""
    host = parts.hostname or ""
    return f"{parts.scheme}://{user}{host}{f':{port}' if port else ''}{parts.path}"


class StoreUnavailable(Exception):
    """The database could not be reached or set up; the message never holds the password."""


class PostgresResponsesStore:
    """Stored responses in PostgreSQL, every call on a worker thread, one at a time.

    Cancellation, for every method, as `ResponsesStore`'s: each is a checkpoint. Cancelled
    before its thread starts (on entry, or while another call holds the one thread), it does
    nothing and raises `Cancelled`. Once its thread runs, it is not abandoned: the call
    completes (a connection attempt within `connect_timeout`, 10 s unless the URL says), a
    write is committed or rolled back, and the cancellation is delivered at the caller's
    next checkpoint. So a `put` under way when its client leaves still stores the response.
    """

    def __init__(
        self,
        url: str,
        limits: StoreLimits | None = None,
    ) -> None:
        self._url = url
        self.path = shown_url(url)
        self.limits = limits or StoreLimits()
        self.runner = secrets.token_hex(8)
        """This server process, as the responses it runs name it (`StoredResponse.runner`)."""
        self._open = False
        self._db: psycopg.Connection[TupleRow] | None = None
        self._limiter = trio.CapacityLimiter(1)

    async def open(self) -> None:
        """Connect, and create the table if missing. Raises `StoreUnavailable` if either
        fails. Cancelled before its thread ran: still closed."""
        await self._run(self._open_db)

    async def close(self) -> None:
        """Close the connection. Cancelled before its thread ran: still open."""
        await self._run(self._close_db)

    async def put(self, record: StoredResponse) -> None:
        """Store `record` (replacing one with its id), then evict past the limits (`_rows.py`),
        in one transaction. Cancelled before its thread ran: nothing was written."""
        fault_points.reach("store_write")
        await self._run(self._call, self._put, record)

    async def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None (never stored, deleted, evicted, or too old)."""
        found: StoredResponse | None = await self._run(self._call, self._get, response_id)
        return found

    async def delete(self, response_id: str) -> bool:
        """Delete a response; whether it was there. Cancelled before its thread ran: nothing
        was deleted. (Should the connection drop while the commit's answer is on its way,
        the retry finds nothing and says False.)"""
        deleted: bool = await self._run(self._call, self._delete, response_id)
        return deleted

    async def append_events(self, response_id: str, events: list[dict[str, Any]]) -> None:
        """Add a streamed response's events (each with its `sequence_number`), if the
        response is still stored. Cancelled before its thread ran: nothing was written."""
        await self._run(self._call, self._append, (response_id, numbered(events)))

    async def events(self, response_id: str, after: int) -> list[dict[str, Any]]:
        """The response's stored events numbered past `after`, in order."""
        found: list[str] = await self._run(self._call, self._events, (response_id, after))
        return [json.loads(event) for event in found]

    async def unfinished(self) -> list[str]:
        """The responses left unfinished by a server process that is gone: their runner's
        lock is free (module docstring). Never this store's own."""
        gone: list[str] = await self._run(self._call, self._unfinished, None)
        return gone

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the store's thread; never abandoned once started (class docstring)."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -- on the worker thread ---------------------------------------------------------------
    def _open_db(self) -> None:
        db = self._connect()
        import psycopg  # imported by _connect: here for its name

        try:
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in _SCHEMA:
                    db.execute(statement)
        except psycopg.Error as error:
            db.close()
            raise StoreUnavailable(
                f"could not create the table at {self.path}: {self._scrubbed(error)}"
            ) from None
        self._close_db()
        self._db, self._open = db, True

    def _close_db(self) -> None:
        self._open = False
        if self._db is not None:
            # The runner's lock released before the connection closes: the server ends a
            # closed session's locks only once its backend has seen the close, after
            # `close` returns, and another store asking meanwhile would find this
            # process still alive.
            with contextlib.suppress(Exception):  # a dropped connection holds no lock
                self._db.execute("SELECT pg_advisory_unlock_all()")
            self._db.close()
            self._db = None

    def _connect(self) -> psycopg.Connection[TupleRow]:
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError:
            raise StoreUnavailable(
                "a PostgreSQL store needs psycopg: pip install 'mlx-nursery[postgres]'"
            ) from None
        try:
            params = {**_CONNECTION_DEFAULTS, **conninfo_to_dict(self._url)}
            db = psycopg.connect(autocommit=True, **params)
        except psycopg.Error as error:
            raise StoreUnavailable(
                f"could not connect to {self.path}: {self._scrubbed(error)}"
            ) from None
        try:  # this process is alive for as long as the session lasts (module docstring)
            db.execute("SELECT pg_advisory_lock(%s)", (_runner_lock(self.runner),))
        except psycopg.Error as error:
            db.close()
            raise StoreUnavailable(
                f"could not lock at {self.path}: {self._scrubbed(error)}"
            ) from None
        return db

    def _call(self, fn: Callable[[psycopg.Connection[TupleRow], A], T], arg: A) -> T:
        """`fn(connection, arg)`, connecting first if no connection is kept. A kept
        connection found dead in use (the server restarted, an idle connection was cut) is
        replaced and the call retried once: puts and gets are idempotent, and a delete's
        answer is as its docstring says. A new connection that fails is dropped, and the
        error raised; the next call connects again."""
        import psycopg

        if not self._open:
            raise RuntimeError("the responses store is not open")
        retry = self._db is not None
        while True:
            if self._db is None:
                self._db = self._connect()
            db = self._db
            try:
                return fn(db, arg)
            except psycopg.OperationalError:
                if not db.broken:
                    raise
                self._db = None
                db.close()
                if not retry:
                    raise
                retry = False

    def _put(self, db: psycopg.Connection[TupleRow], record: StoredResponse) -> None:
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            write(db, _DIALECT, record, self.limits)

    def _get(self, db: psycopg.Connection[TupleRow], response_id: str) -> StoredResponse | None:
        return read(db, _DIALECT, response_id, self.limits.max_age_seconds)

    def _delete(self, db: psycopg.Connection[TupleRow], response_id: str) -> bool:
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            return delete(db, _DIALECT, response_id)

    def _append(
        self, db: psycopg.Connection[TupleRow], given: tuple[str, list[tuple[int, str]]]
    ) -> None:
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            append_events(db, _DIALECT, *given)

    def _events(self, db: psycopg.Connection[TupleRow], given: tuple[str, int]) -> list[str]:
        return read_events(db, _DIALECT, *given)

    def _unfinished(self, db: psycopg.Connection[TupleRow], _: None) -> list[str]:
        found = unfinished(db, _DIALECT)
        gone: list[str] = []
        for runner in sorted({runner for _, runner in found} - {self.runner}):
            key = _runner_lock(runner)
            if db.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchall()[0][0]:
                db.execute("SELECT pg_advisory_unlock(%s)", (key,))
                gone += [response_id for response_id, owner in found if owner == runner]
        return gone

    def _scrubbed(self, error: BaseException) -> str:
        """`error`'s message with the password taken out (libpq's never quotes it; a
        parse error of the URL could)."""
        message = f"{type(error).__name__}: {error}".strip()
        try:
            password = urlsplit(self._url).password
        except ValueError:
            password = None
        for secret in {password, unquote(password or "")} - {None, ""}:
            assert secret is not None
            message = message.replace(secret, "***")
        return message
