"""What the store keeps for background responses, for each backend (SQLite and a real
PostgreSQL): a streamed response's events, in order, kept when its row is replaced and
counted in its bytes, gone with the row; and which unfinished responses were left by a
process that is gone (a store closed) rather than one still running (a store open)."""

from __future__ import annotations

import attrs

from mlx_nursery.store import StoredResponse
from tests.store.test_responses_store import _Opened, _record, location, opened

__all__ = ["location", "opened"]  # fixtures, shared with test_responses_store.py


def _events(first: int, last: int) -> list[dict[str, object]]:
    return [{"type": "e", "n": "\u00e9\x00", "sequence_number": i} for i in range(first, last)]


async def test_events_keep_their_order_and_go_with_their_row(
    location: str, opened: _Opened
) -> None:
    store = await opened(location, max_responses=2)
    await store.append_events("resp_1", _events(0, 2))  # no row yet: dropped
    await store.put(_record(1))
    await store.append_events("resp_1", _events(0, 3))
    await store.append_events("resp_1", _events(3, 5))
    await store.append_events("resp_1", [{"type": "other", "sequence_number": 4}])  # kept as was
    assert await store.events("resp_1", -1) == _events(0, 5)
    assert await store.events("resp_1", 2) == _events(3, 5)
    assert await store.events("resp_1", 4) == []

    finished = attrs.evolve(_record(1), body={"status": "completed"})
    await store.put(finished)  # a row replaced keeps its events
    assert await store.events("resp_1", -1) == _events(0, 5)
    assert await store.delete("resp_1")
    assert await store.events("resp_1", -1) == []

    await store.put(_record(2))
    await store.append_events("resp_2", _events(0, 1))
    await store.put(_record(3))
    await store.put(_record(4))  # evicts resp_2, its events with it
    assert await store.get("resp_2") is None
    assert await store.events("resp_2", -1) == []


async def test_events_count_in_their_owners_bytes(location: str, opened: _Opened) -> None:
    """A response's events are its owner's bytes: with a budget of one row's documents,
    a row whose events pass it makes room by evicting the older row."""
    probe = await opened(location)
    await probe.put(_record(1))
    await probe.put(_record(2))
    big = [{"type": "e", "text": "x" * 5000, "sequence_number": 0}]
    store = await opened(location, max_bytes=4000)
    await store.append_events("resp_2", big)
    await store.put(_record(3))  # the eviction counts resp_2's events
    assert await store.get("resp_1") is None and await store.get("resp_2") is None
    assert await store.get("resp_3") is not None


async def test_unfinished_responses_of_a_gone_process_are_found(
    location: str, opened: _Opened
) -> None:
    """`unfinished` names what a process that is gone left queued or in progress: not a
    store's own, not a live store's (PostgreSQL: its runner's lock is held), a closed one's."""
    running, other = await opened(location), await opened(location)
    mine = attrs.evolve(_record(1), runner=running.runner)
    theirs = attrs.evolve(_record(2), runner=other.runner)
    await running.put(mine)
    await running.put(theirs)
    await running.put(_record(3))  # finished: no runner
    assert (await running.get("resp_1")) == mine
    assert await running.unfinished() == (
        [] if location.startswith("postgresql://") else ["resp_2"]
    )
    await other.close()
    opened.stores.remove(other)
    assert await running.unfinished() == ["resp_2"]
    later = await opened(location)  # a process started after: both are someone else's
    gone = await later.unfinished()
    assert sorted(gone) == (
        ["resp_2"] if location.startswith("postgresql://") else ["resp_1", "resp_2"]
    )
    await running.put(attrs.evolve(theirs, runner=None, body={"status": "failed"}))
    assert "resp_2" not in await later.unfinished()
    assert isinstance(await later.get("resp_2"), StoredResponse)
