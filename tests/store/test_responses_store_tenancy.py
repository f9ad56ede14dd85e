"""The Responses store's owners, quotas and large strings, for each backend (SQLite and a
real PostgreSQL): a key over its quota evicts only its own rows; byte limits evict the
oldest; a large string (an image) is kept and counted once however many documents and rows
hold it; a database from before owners is migrated in place."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from typing import Any

from mlx_nursery.store import StoredResponse
from tests.store.test_responses_store import _Opened, location, opened

__all__ = ["location", "opened"]  # fixtures, shared with test_responses_store.py

IMAGE = "data:image/png;base64," + "iVBORw0KGgo" * 20_000
"""A large string, as a request's image is: 220 kB."""


def _query(location: str, sql: str) -> list[Any]:
    """Rows of `sql` on the store's own database (its tables named as SQLite's)."""
    if location.startswith("postgresql://"):
        import psycopg

        sql = re.sub(r"\bresponses\b", "mlx_nursery_responses", sql)
        sql = re.sub(r"\bresponse_blobs\b", "mlx_nursery_responses_blobs", sql)
        with psycopg.connect(location) as db:
            return db.execute(sql).fetchall()
    with sqlite3.connect(location) as db:
        return db.execute(sql).fetchall()


def _stored_bytes(location: str) -> int:
    """Bytes the store's rows and strings hold."""
    ((documents,),) = _query(location, "SELECT COALESCE(SUM(bytes), 0) FROM responses")
    ((strings,),) = _query(location, "SELECT COALESCE(SUM(length(value)), 0) FROM response_blobs")
    return int(documents) + int(strings)


def _record(
    name: str, owner: str | None, age: float, *, payload: str = "", image: str | None = None
) -> StoredResponse:
    """A response `age` seconds old; `image` in its input items and conversation, `payload`
    in its body (after the name: each row's its own)."""
    content: list[dict[str, Any]] = [{"type": "input_text", "text": f"question {name}"}]
    if image is not None:
        content.append({"type": "input_image", "image_url": image, "detail": "auto"})
    message = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}]
    return StoredResponse(
        f"resp_{name}",
        time.time() - age,
        {"id": f"resp_{name}", "output_text": name + payload},
        [{"id": f"msg_{name}", "type": "message", "role": "user", "content": content}],
        message if image is not None else [{"role": "user", "content": f"question {name}"}],
        owner,
    )


async def _kept(store: Any, *names: str) -> list[str]:
    return [name for name in names if await store.get(f"resp_{name}") is not None]


async def test_a_key_over_its_row_quota_evicts_only_its_own_oldest(
    location: str, opened: _Opened
) -> None:
    store = await opened(location, max_per_owner=3, max_responses=100)
    await store.put(_record("a1", "key-a", 100))
    await store.put(_record("a2", "key-a", 99))
    await store.put(_record("open", None, 98))
    for n in range(5):
        await store.put(_record(f"b{n}", "key-b", 90 - n))
    assert await _kept(store, "a1", "a2", "open", "b0", "b1", "b2", "b3", "b4") == [
        "a1", "a2", "open", "b2", "b3", "b4",
    ]  # fmt: skip
    got = await store.get("resp_a1")
    assert got is not None and got.owner == "key-a"
    opened_row = await store.get("resp_open")
    assert opened_row is not None and opened_row.owner is None
    # The anonymous tenant (a server without keys) has no quota of its own: the store's.
    for n in range(5):
        await store.put(_record(f"o{n}", None, 80 - n))
    assert await _kept(store, "open", "o0", "o4") == ["open", "o0", "o4"]


async def test_byte_limits_evict_the_oldest_of_the_key_then_of_the_store(
    location: str, opened: _Opened
) -> None:
    payload = "x" * 10_000  # each row about 10 kB
    store = await opened(location, max_bytes_per_owner=25_000, max_bytes=55_000)
    await store.put(_record("a1", "key-a", 100, payload=payload))
    await store.put(_record("a2", "key-a", 99, payload=payload))
    for n in range(4):  # b's third row puts b past its quota: b's oldest goes, never a's
        await store.put(_record(f"b{n}", "key-b", 90 - n, payload=payload))
    assert await _kept(store, "a1", "a2", "b0", "b1", "b2", "b3") == ["a1", "a2", "b2", "b3"]
    assert _stored_bytes(location) < 55_000
    # The whole store past its budget: the oldest row overall goes, whoever owns it.
    await store.put(_record("c1", "key-c", 50, payload=payload))
    await store.put(_record("c2", "key-c", 49, payload=payload))
    assert await _kept(store, "a1", "a2", "b2", "b3", "c1", "c2") == ["a2", "b2", "b3", "c1", "c2"]
    assert _stored_bytes(location) < 55_000
    # A response larger than the limit is still stored, alone.
    await store.put(_record("big", "key-a", 10, payload="y" * 60_000))
    assert await _kept(store, "a2", "b2", "b3", "c1", "c2", "big") == ["big"]


async def test_a_large_string_is_stored_and_counted_once(location: str, opened: _Opened) -> None:
    store = await opened(location, max_bytes_per_owner=3 * len(IMAGE) // 2)
    first = _record("first", "key-a", 10, image=IMAGE)
    await store.put(first)
    assert await store.get(first.id) == first
    assert len(IMAGE) < _stored_bytes(location) < len(IMAGE) + 2_000  # not twice
    # A follow-up carries the image again in its conversation: the same entry, counted once
    # for the key (under its quota of 1.5 images, both rows stay).
    follow = StoredResponse(
        "resp_follow", time.time() - 5, {"id": "resp_follow"}, [], first.conversation, "key-a"
    )
    await store.put(follow)
    assert await _kept(store, "first", "follow") == ["first", "follow"]
    assert _query(location, "SELECT COUNT(*) FROM response_blobs") == [(1,)]
    assert await store.get(follow.id) == follow
    # Another key's row with the same image shares the entry; deleting rows keeps it while
    # one references it, and deletes it with the last.
    other = _record("other", "key-b", 4, image=IMAGE)
    await store.put(other)
    assert len(IMAGE) < _stored_bytes(location) < len(IMAGE) + 4_000
    assert await store.delete(first.id) and await store.delete(follow.id)
    assert await store.get(other.id) == other
    assert await store.delete(other.id)
    assert _query(location, "SELECT COUNT(*) FROM response_blobs") == [(0,)]


async def test_a_string_another_key_still_holds_is_freed_from_a_keys_quota(
    location: str, opened: _Opened
) -> None:
    """Key a's oldest row, with the image key b also stored, is evicted: a no longer holds
    the image, so a's next row stays though b's row keeps the image on disk."""
    store = await opened(location, max_bytes_per_owner=3 * len(IMAGE) // 2)
    await store.put(_record("b", "key-b", 20, image=IMAGE))
    await store.put(_record("a_image", "key-a", 10, image=IMAGE))
    await store.put(_record("a_text", "key-a", 9))
    await store.put(_record("a_other", "key-a", 8, image=IMAGE.replace("G", "H")))
    assert await _kept(store, "b", "a_image", "a_text", "a_other") == ["b", "a_text", "a_other"]


async def test_an_evicted_rows_large_strings_go_with_it(location: str, opened: _Opened) -> None:
    store = await opened(location, max_responses=1)
    await store.put(_record("image", "key-a", 10, image=IMAGE))
    await store.put(_record("text", "key-a", 5))
    assert await _kept(store, "image", "text") == ["text"]
    assert _query(location, "SELECT COUNT(*) FROM response_blobs") == [(0,)]


async def test_strings_that_look_like_markers_round_trip(location: str, opened: _Opened) -> None:
    """A client's strings beginning with NUL, beside a large string and without one."""
    store = await opened(location)
    tricky = ["\x00", "\x00\x00x", "\x00blob:" + "0" * 64, "\x00blob:", "plain"]
    for name, image in (("with", IMAGE), ("without", None)):
        record = _record(name, "key-a", 1, image=image)
        record = StoredResponse(
            record.id, record.created_at, {"tricky": tricky}, record.input_items,
            record.conversation, record.owner,
        )  # fmt: skip
        await store.put(record)
        assert await store.get(record.id) == record


_OLD_SCHEMA = """CREATE TABLE {table} (
    id TEXT PRIMARY KEY, created_at {real} NOT NULL, body TEXT NOT NULL,
    input_items TEXT NOT NULL, conversation TEXT NOT NULL
)"""


async def test_a_database_from_before_owners_is_migrated(location: str, opened: _Opened) -> None:
    """Its rows are the anonymous tenant's (an open server's; with keys, an admin's), and
    count for the store's byte budget."""
    old = StoredResponse(
        "resp_old", time.time() - 50, {"id": "resp_old", "text": "\x00\x00" + "k" * 2_000}, [], []
    )
    values = (
        old.id, old.created_at, json.dumps(old.body), json.dumps(old.input_items),
        json.dumps(old.conversation),
    )  # fmt: skip
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as db:
            db.execute(_OLD_SCHEMA.format(table="mlx_nursery_responses", real="DOUBLE PRECISION"))
            db.execute("INSERT INTO mlx_nursery_responses VALUES (%s, %s, %s, %s, %s)", values)
    else:
        with sqlite3.connect(location) as db:
            db.execute(_OLD_SCHEMA.format(table="responses", real="REAL"))
            db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?)", values)
    store = await opened(location, max_bytes=11_000)
    assert await store.get(old.id) == old  # owner None; its strings as they were
    ((counted,),) = _query(location, "SELECT bytes FROM responses WHERE id = 'resp_old'")
    assert counted == sum(len(text) for text in values[2:])
    again = await opened(location, max_bytes=11_000)  # opening again changes nothing
    assert await again.get(old.id) == old
    # New rows go beside it; the byte budget counts it (the oldest, it goes first).
    await store.put(_record("new", "key-a", 10, payload="x" * 4_000))
    assert await _kept(store, "old", "new") == ["old", "new"]
    await store.put(_record("newer", "key-a", 5, payload="x" * 6_000))
    assert await _kept(store, "old", "new", "newer") == ["new", "newer"]
