"""Lanes ordered by priority and shared fairly among tenants (`engine/_lanes.py`): who gets a
freed lane, aging, which running borrower a better waiter asks for, and that a cancelled
wait leaves nothing borrowed. Pure Trio: no model."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mlx_nursery.engine._lanes import FairLanes, LaneStatistics
from mlx_nursery.engine._priority import PriorityPolicy


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


# -- priorities (engine/_priority.py) -----------------------------------------------------------
async def _queue_at(
    lanes: FairLanes, order: list[str], name: str, tenant: str | None, priority: int
) -> None:
    await lanes.acquire_on_behalf_of(name, tenant, priority)
    order.append(name)


async def _served_in_turn(
    lanes: FairLanes, waiters: list[tuple[str, str | None, int]]
) -> list[str]:
    """Hold the one lane, line `waiters` up (name, tenant, priority), then free the lane
    after each grant: the order they were served in."""
    await lanes.acquire_on_behalf_of("first", None)
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        for name, tenant, priority in waiters:
            nursery.start_soon(_queue_at, lanes, order, name, tenant, priority)
            await trio.testing.wait_all_tasks_blocked()
        served = "first"
        for _ in waiters:
            lanes.release_on_behalf_of(served)
            await trio.testing.wait_all_tasks_blocked()
            served = order[-1]
    lanes.release_on_behalf_of(order[-1])
    assert lanes.borrowed_tokens == 0
    return order


async def test_a_freed_lane_goes_to_the_best_priority_then_fairly_within_it() -> None:
    order = await _served_in_turn(
        FairLanes(1),
        [("a-low", "A", 1), ("a1", "A", 0), ("b1", "B", 0), ("a2", "A", 0), ("b-high", "B", -1)],
    )
    # B was served last (b-high), so A goes first within priority 0; the low one waits for
    # all of them (4 better ones passed it: fewer than the default aging of 8).
    assert order == ["b-high", "a1", "b1", "a2", "a-low"]


@pytest.mark.parametrize(
    ("aging", "expected"),
    [(2, ["h1", "h2", "low", "h3", "h4", "h5"]), (100, ["h1", "h2", "h3", "h4", "h5", "low"])],
)
async def test_a_waiting_request_gains_a_class_per_aging_admissions_of_better_ones(
    aging: int, expected: list[str]
) -> None:
    """Aging counts admissions, not seconds: after `aging` better requests passed it, the low
    one is of their class and, in line before the later ones, goes next."""
    lanes = FairLanes(1, PriorityPolicy(aging=aging))
    waiters = [("low", None, 1), *[(f"h{i}", None, 0) for i in range(1, 6)]]
    assert await _served_in_turn(lanes, waiters) == expected


async def test_a_better_waiter_asks_for_the_newest_worst_lane_at_most_max_preemptions_times() -> (
    None
):
    lanes = FairLanes(2, PriorityPolicy(max_preemptions=1))
    asked: list[object] = []
    resumed: list[str] = []
    lanes.preempt = asked.append
    await lanes.acquire_on_behalf_of("old-low", None, 1)
    await lanes.acquire_on_behalf_of("new-low", None, 1)
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_queue_at, lanes, order, "high", None, -1)
        await trio.testing.wait_all_tasks_blocked()
        assert asked == ["new-low"]  # the newest of the worst class
        nursery.start_soon(_queue_at, lanes, order, "high-2", None, -1)
        await trio.testing.wait_all_tasks_blocked()
        assert asked == ["new-low", "old-low"]  # one per better waiter
        lanes.suspended("new-low", lambda: resumed.append("new-low"))
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["high"]
        assert lanes.statistics() == LaneStatistics(2, 2, 1, 1)
        lanes.kept("old-low")  # the owner could not (it ended, say): nobody else is worse
        assert asked == ["new-low", "old-low"]
        lanes.release_on_behalf_of("high")
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["high", "high-2"] and resumed == []
        lanes.release_on_behalf_of("high-2")
        assert resumed == ["new-low"]  # back, without a task: its resume callback
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_queue_at, lanes, order, "high-3", None, -1)
        await trio.testing.wait_all_tasks_blocked()
        # new-low yielded its one time; old-low was kept for this lane: nobody is asked.
        assert asked == ["new-low", "old-low"]
        lanes.withdraw("new-low")
    assert order[-1] == "high-3"
    assert set(lanes.waits()) == {1, -1}
    assert lanes.waits()[-1].count == 3 and lanes.waits()[1].count == 2


async def test_a_suspended_borrower_withdrawn_leaves_nothing_behind() -> None:
    lanes = FairLanes(1)
    lanes.preempt = lambda borrower: None
    await lanes.acquire_on_behalf_of("low", "A", 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lanes.acquire_on_behalf_of, "high", "B", 0)
        await trio.testing.wait_all_tasks_blocked()
        lanes.suspended("low", lambda: pytest.fail("a withdrawn borrower is never resumed"))
    assert lanes.statistics() == LaneStatistics(1, 1, 0, 1)
    assert lanes.waiting_for("A") == 0  # a suspended borrower takes no share of the queue
    lanes.withdraw("low")  # its sequence ended (cancelled) while it waited
    lanes.release_on_behalf_of("high")
    assert lanes.statistics() == LaneStatistics(0, 1, 0, 0)
    with pytest.raises(RuntimeError):
        lanes.withdraw("low")
