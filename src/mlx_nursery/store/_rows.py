"""The rows of the Responses store and their limits: one set of statements, run on SQLite's
connection or PostgreSQL's (`Dialect` names the tables and the placeholder).

Four tables: the responses (each with its owner, its documents' bytes, and the server
process running it while it is unfinished), the large strings stored once by content
(`_blobs.py`, each with its bytes), which response references which string (with the
response's owner), and a streamed background response's events (each as JSON, by its
sequence number). A string no response references any more is deleted with the last row
that did; a response's events go with its row (a put replacing the row keeps them).

Who owns a row: a tenant's id (a digest of its API key, see http/_tenancy.py), or '' for
the anonymous tenant of a server without keys. Rows stored before owners existed get ''
when the column is added: an open server sees them, as it did, and with keys on only an
admin key does (no key can be shown to have stored them).

Bytes: an owner holds its rows' documents and events, and each large string its rows
reference, once however many of its rows do (a conversation's image, carried by every
follow-up); the store holds every row's documents and events and each string once.
Eviction, in the transaction of each put, oldest first (`created_at`):
1. rows past the age limit;
2. the putting owner's rows past its own count and byte quotas (the anonymous tenant, the
   only one of an open server, has none: the whole store is its own);
3. rows past the whole store's count and byte limits.
So a key that fills its quota evicts only its own rows; another key's go only when the
whole store is full. A byte limit never evicts the newest row it counts (a response larger
than the limit is still stored, alone): a limit is exceeded by at most one response.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

import attrs

from ._blobs import EncodedRow, decode, encode, loaded

_DAY = 24 * 3600


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
    owner: str | None = None
    """The tenant that stored it (None: the anonymous tenant of a server without keys)."""
    runner: str | None = None
    """The server process running it (its store's `runner`) while it is unfinished: a
    background response queued or in progress; None once it has ended."""


@attrs.frozen
class StoreLimits:
    """What a store keeps; past a limit, the oldest rows go (module docstring)."""

    max_responses: int = 10_000
    max_bytes: int = 1 << 30
    max_per_owner: int = 1_000
    """Rows an owner with a key may keep."""
    max_bytes_per_owner: int = 128 << 20
    """Bytes an owner with a key may keep (its rows' documents and referenced strings)."""
    max_age_seconds: float = 30 * _DAY


SQLValue = str | int | float | None
"""What a statement's parameters hold: ids, owners, documents as JSON text, times, sizes."""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> list[tuple[Any, ...]]: ...


class Connection(Protocol):
    """What both sqlite3's and psycopg's connections offer."""

    def execute(self, sql: str, parameters: tuple[SQLValue, ...], /) -> Cursor: ...


@attrs.frozen
class Dialect:
    responses: str
    blobs: str
    refs: str
    events: str
    placeholder: str

    def sql(self, template: str) -> str:
        """`template` with its tables named ({r}, {b}, {refs}, {e}) and '?' as our
        placeholder."""
        named = template.format(r=self.responses, b=self.blobs, refs=self.refs, e=self.events)
        return named.replace("?", self.placeholder)

    def schema(self) -> list[str]:
        """The tables the columns migration needs, and the indexes: safe to run again."""
        return [
            self.sql(statement)
            for statement in (
                "CREATE TABLE IF NOT EXISTS {b} (digest TEXT PRIMARY KEY, size BIGINT NOT NULL,"
                " value TEXT NOT NULL)",
                "CREATE TABLE IF NOT EXISTS {refs} (response_id TEXT NOT NULL,"
                " digest TEXT NOT NULL, owner TEXT NOT NULL, PRIMARY KEY (response_id, digest))",
                "CREATE INDEX IF NOT EXISTS {refs}_digest ON {refs} (digest)",
                "CREATE INDEX IF NOT EXISTS {refs}_owner ON {refs} (owner, digest)",
                # Covering the sums of each put's eviction: no row's documents are read.
                "CREATE INDEX IF NOT EXISTS {b}_size ON {b} (digest, size)",
                "DROP INDEX IF EXISTS {r}_created_at",
                "CREATE INDEX IF NOT EXISTS {r}_age ON {r} (created_at, bytes)",
                "CREATE INDEX IF NOT EXISTS {r}_owner ON {r} (owner, created_at, bytes)",
                "CREATE INDEX IF NOT EXISTS {r}_runner ON {r} (runner) WHERE runner != ''",
                "CREATE TABLE IF NOT EXISTS {e} (response_id TEXT NOT NULL,"
                " seq BIGINT NOT NULL, event TEXT NOT NULL, PRIMARY KEY (response_id, seq))",
                # Rows from before `bytes` existed: their documents' length (ASCII JSON).
                "UPDATE {r} SET bytes = length(body) + length(input_items)"
                " + length(conversation) WHERE bytes = 0",
            )
        ]


_COLUMNS = "id, created_at, owner, runner, bytes, body, input_items, conversation"


def write(db: Connection, dialect: Dialect, record: StoredResponse, limits: StoreLimits) -> None:
    """Store `record` (replacing one with its id, whose events stay), then evict past
    `limits` (module docstring); in the caller's transaction."""
    row = encode(record.body, record.input_items, record.conversation)
    owner = record.owner or ""
    _drop(db, dialect, record.id, None, keep_events=True)
    _insert(db, dialect, record, owner, row)
    expired = db.execute(
        dialect.sql("SELECT id FROM {r} WHERE created_at < ?"),
        (time.time() - limits.max_age_seconds,),
    )
    for (response_id,) in expired.fetchall():
        _drop(db, dialect, response_id, None)
    if owner:
        _evict(db, dialect, owner, limits.max_per_owner, limits.max_bytes_per_owner)
    _evict(db, dialect, None, limits.max_responses, limits.max_bytes)


def read(
    db: Connection, dialect: Dialect, response_id: str, max_age: float
) -> StoredResponse | None:
    """The stored response, restored; None if missing or older than `max_age` seconds. One
    statement: one snapshot of the row and its strings."""
    rows = db.execute(
        dialect.sql(
            "SELECT r.id, r.created_at, r.owner, r.runner, r.body, r.input_items,"
            " r.conversation, b.digest, b.value FROM {r} AS r"
            " LEFT JOIN {refs} AS refs ON refs.response_id = r.id"
            " LEFT JOIN {b} AS b ON b.digest = refs.digest WHERE r.id = ?"
        ),
        (response_id,),
    ).fetchall()
    if not rows or rows[0][1] < time.time() - max_age:
        return None
    id_, created_at, owner, runner, body, input_items, conversation = rows[0][:7]
    blobs = loaded({row[7]: row[8] for row in rows if row[7] is not None})
    return StoredResponse(
        id_,
        created_at,
        decode(body, blobs),
        decode(input_items, blobs),
        decode(conversation, blobs),
        owner or None,
        runner or None,
    )


def delete(db: Connection, dialect: Dialect, response_id: str) -> bool:
    """Delete a response (and the strings only it referenced); whether it was there. In the
    caller's transaction."""
    return _drop(db, dialect, response_id, None) is not None


def append_events(
    db: Connection, dialect: Dialect, response_id: str, events: list[tuple[int, str]]
) -> None:
    """Add a response's events (sequence number, JSON), if its row is still stored (evicted
    or deleted: dropped with it); in the caller's transaction. An event already stored under
    its number is kept as it was."""
    if not db.execute(dialect.sql("SELECT 1 FROM {r} WHERE id = ?"), (response_id,)).fetchall():
        return
    for number, event in events:
        db.execute(
            dialect.sql(
                "INSERT INTO {e} (response_id, seq, event) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
            ),
            (response_id, number, event),
        )
    db.execute(
        dialect.sql("UPDATE {r} SET bytes = bytes + ? WHERE id = ?"),
        (sum(len(event) for _, event in events), response_id),
    )


def numbered(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Events as stored: (sequence number, JSON in ASCII: PostgreSQL's text holds no NUL)."""
    return [(int(event["sequence_number"]), json.dumps(event)) for event in events]


def read_events(db: Connection, dialect: Dialect, response_id: str, after: int) -> list[str]:
    """A response's events (JSON) numbered past `after`, in order."""
    rows = db.execute(
        dialect.sql("SELECT event FROM {e} WHERE response_id = ? AND seq > ? ORDER BY seq"),
        (response_id, after),
    ).fetchall()
    return [event for (event,) in rows]


def unfinished(db: Connection, dialect: Dialect) -> list[tuple[str, str]]:
    """Every unfinished response (its id) and the server process running it."""
    rows = db.execute(dialect.sql("SELECT id, runner FROM {r} WHERE runner != ''"), ()).fetchall()
    return [(response_id, runner) for response_id, runner in rows]


def _insert(
    db: Connection, dialect: Dialect, record: StoredResponse, owner: str, row: EncodedRow
) -> None:
    (kept,) = db.execute(
        dialect.sql("SELECT COALESCE(SUM(length(event)), 0) FROM {e} WHERE response_id = ?"),
        (record.id,),
    ).fetchall()[0]
    db.execute(
        dialect.sql(f"INSERT INTO {{r}} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
        (
            record.id,
            record.created_at,
            owner,
            record.runner or "",
            row.size + int(kept),
            row.body,
            row.input_items,
            row.conversation,
        ),
    )
    for digest, literal in row.blobs.items():
        db.execute(
            dialect.sql(
                "INSERT INTO {b} (digest, size, value) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
            ),
            (digest, len(literal), literal),
        )
        db.execute(
            dialect.sql("INSERT INTO {refs} (response_id, digest, owner) VALUES (?, ?, ?)"),
            (record.id, digest, owner),
        )


def _evict(
    db: Connection, dialect: Dialect, owner: str | None, max_rows: int, max_bytes: int
) -> None:
    """Drop the oldest rows of `owner` (None: of the whole store) while past either limit;
    the newest row always stays."""
    rows, used = _usage(db, dialect, owner)
    where, scope = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())
    oldest = dialect.sql(f"SELECT id FROM {{r}} {where} ORDER BY created_at LIMIT 1")
    while rows > 1 and (rows > max_rows or used > max_bytes):
        (response_id,) = db.execute(oldest, scope).fetchall()[0]
        used -= _drop(db, dialect, response_id, owner) or 0
        rows -= 1


def _usage(db: Connection, dialect: Dialect, owner: str | None) -> tuple[int, int]:
    """Rows and bytes (module docstring) of `owner`, or of the whole store; one statement."""
    if owner is None:
        query = (
            "SELECT (SELECT COUNT(*) FROM {r}), (SELECT COALESCE(SUM(bytes), 0) FROM {r}),"
            " (SELECT COALESCE(SUM(size), 0) FROM {b})"
        )
        parameters: tuple[str, ...] = ()
    else:
        query = (
            "SELECT (SELECT COUNT(*) FROM {r} WHERE owner = ?),"
            " (SELECT COALESCE(SUM(bytes), 0) FROM {r} WHERE owner = ?),"
            " (SELECT COALESCE(SUM(size), 0) FROM {b} WHERE digest IN"
            " (SELECT digest FROM {refs} WHERE owner = ?))"
        )
        parameters = (owner, owner, owner)
    rows, documents, strings = db.execute(dialect.sql(query), parameters).fetchall()[0]
    return int(rows), int(documents) + int(strings)


def _drop(
    db: Connection,
    dialect: Dialect,
    response_id: str,
    owner: str | None,
    *,
    keep_events: bool = False,
) -> int | None:
    """Delete a row, its references, its events (unless `keep_events`: a put replacing the
    row), and the strings no row references any more; the bytes this freed for `owner`
    (None: for the whole store), or None if there was no such row."""
    found = db.execute(
        dialect.sql(
            "SELECT r.bytes, b.digest, b.size FROM {r} AS r"
            " LEFT JOIN {refs} AS refs ON refs.response_id = r.id"
            " LEFT JOIN {b} AS b ON b.digest = refs.digest WHERE r.id = ?"
        ),
        (response_id,),
    ).fetchall()
    if not found:
        return None
    db.execute(dialect.sql("DELETE FROM {refs} WHERE response_id = ?"), (response_id,))
    db.execute(dialect.sql("DELETE FROM {r} WHERE id = ?"), (response_id,))
    if not keep_events:
        db.execute(dialect.sql("DELETE FROM {e} WHERE response_id = ?"), (response_id,))
    freed = int(found[0][0])
    for _, digest, size in found:
        if digest is None:
            continue
        if not _referenced(db, dialect, digest, None):
            db.execute(dialect.sql("DELETE FROM {b} WHERE digest = ?"), (digest,))
            freed += int(size)
        elif owner is not None and not _referenced(db, dialect, digest, owner):
            freed += int(size)
    return freed


def _referenced(db: Connection, dialect: Dialect, digest: str, owner: str | None) -> bool:
    """Whether a row (of `owner`; None: any) still references the string `digest`."""
    query = "SELECT 1 FROM {refs} WHERE digest = ?"
    parameters: tuple[str, ...] = (digest,)
    if owner is not None:
        query, parameters = query + " AND owner = ?", (digest, owner)
    return bool(db.execute(dialect.sql(query + " LIMIT 1"), parameters).fetchall())
