"""Lanes shared fairly among tenants (`engine/_lanes.py`): who gets a freed lane, and that a
cancelled wait leaves nothing borrowed. Pure Trio: no model."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mlx_nursery.engine._lanes import FairLanes


async def _queue(lanes: FairLanes, order: list[str], name: str, tenant: str) -> None:
    await lanes.acquire_on_behalf_of(name, tenant)
    order.append(name)


async def test_a_freed_lane_goes_to_the_tenant_holding_fewest_then_fifo_within_one() -> None:
    lanes = FairLanes(1)
    await lanes.acquire_on_behalf_of("a0", "A")
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        for name in ("a1", "a2", "a3"):
            nursery.start_soon(_queue, lanes, order, name, "A")
            await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_queue, lanes, order, "b1", "B")
        await trio.testing.wait_all_tasks_blocked()
        assert lanes.statistics().tasks_waiting == 4
        assert lanes.waiting_for("A") == 3
        for held in ("a0", "b1", "a1", "a2"):
            lanes.release_on_behalf_of(held)
            await trio.testing.wait_all_tasks_blocked()
    # FIFO would have served a1, a2, a3, then b1.
    assert order == ["b1", "a1", "a2", "a3"]
    lanes.release_on_behalf_of("a3")
    assert lanes.borrowed_tokens == 0


async def test_among_waiting_tenants_the_least_recently_served_goes_first() -> None:
    lanes = FairLanes(1)
    await lanes.acquire_on_behalf_of("a0", "A")
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        for name, tenant in (("a1", "A"), ("b1", "B"), ("c1", "C"), ("b2", "B")):
            nursery.start_soon(_queue, lanes, order, name, tenant)
            await trio.testing.wait_all_tasks_blocked()
        for held in ("a0", "b1", "c1", "a1"):
            lanes.release_on_behalf_of(held)
            await trio.testing.wait_all_tasks_blocked()
    assert order == ["b1", "c1", "a1", "b2"]


async def test_a_cancelled_wait_borrows_nothing_and_a_free_lane_is_taken_at_once() -> None:
    lanes = FairLanes(1)
    await lanes.acquire_on_behalf_of("held", None)
    with trio.move_on_after(0) as waited:
        await lanes.acquire_on_behalf_of("gone", "A")
    assert waited.cancelled_caught
    assert lanes.statistics().tasks_waiting == 0
    assert lanes.borrowed_tokens == 1
    lanes.release_on_behalf_of("held")
    await lanes.acquire_on_behalf_of("next", "B")
    assert lanes.borrowed_tokens == 1
    with pytest.raises(RuntimeError):
        lanes.release_on_behalf_of("gone")
