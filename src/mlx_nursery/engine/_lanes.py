"""Device lanes, ordered by priority and shared fairly among tenants.

A lane is a sequence's place on the device (DESIGN.md: a token of a capacity limiter,
borrowed before admission, returned only once the engine confirms the sequence left).
`trio.CapacityLimiter` hands free lanes out first come, first served: one client that
keeps the queue full makes everyone else wait behind all of its requests, and an urgent
request waits behind every earlier one. `FairLanes` keeps the limiter's contract (borrow on
behalf of a sequence, cancellable waits, `statistics()`) and changes who is served next when
a lane frees: the best class first (`_priority`: a request's priority, improved by aging);
within it, the waiting tenant that holds the fewest lanes, ties to the one served least
recently; first come, first served within a tenant and class. A tenant is an opaque name the
caller gives (the server's: a digest of the API key); requests without one are one tenant
among the others. With one priority and one tenant it is the limiter's FIFO.

Preemption, where the owner allows it (`preempt` set: the text engine): while no lane is
free and a request waits whose class is better than a running one's, the lanes ask the owner
to take that one off the device (the newest of the worst class first; each request at most
`PriorityPolicy.max_preemptions` times). The owner answers `suspended` (the sequence computes
nothing and holds no KV: its lane goes to the best waiter, and it waits for a lane again in
its old place in line, a callback instead of a task) or `kept` (it could not: it is not
asked again while it holds this lane).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping

import attrs
import trio

from ._priority import PriorityPolicy, WaitRecorder, WaitStatistics


@attrs.frozen
class LaneStatistics:
    borrowed_tokens: int
    total_tokens: int
    tasks_waiting: int
    """Arrivals waiting for a lane (each a task in `acquire_on_behalf_of`)."""
    suspended_waiting: int = 0
    """Borrowers taken off the device for a better class, waiting for a lane again."""


@attrs.define(eq=False)
class _Waiter:
    borrower: object
    tenant: Hashable
    priority: int
    order: int
    """Its place in line (arrival order); a suspended borrower waits again in its old place."""
    since: float
    resume: Callable[[], None] | None = None
    """A suspended borrower's: called once it has a lane again (no task waits for it)."""
    preemptions: int = 0
    passed: int = 0
    """Lanes granted, while it waits, to requests of a better priority (aging)."""
    granted: trio.Event = attrs.Factory(trio.Event)


@attrs.define(eq=False)
class _Loan:
    tenant: Hashable
    priority: int
    rank: int
    """The class it was admitted with, kept while it runs."""
    order: int
    preemptions: int
    asked: bool = False
    """Asked to give up its lane; no answer yet."""
    kept: bool = False
    """Asked, and its owner could not: not asked again while it holds this lane."""


class FairLanes:
    """`total` lanes, lent to borrowers by class, fairly among tenants within one."""

    def __init__(self, total: int, policy: PriorityPolicy | None = None) -> None:
        self.total_tokens = total
        self.policy = policy or PriorityPolicy()
        self.preempt: Callable[[object], None] | None = None
        """Asks the owner to take a running borrower off the device for a waiting one of a
        better class; it answers with `suspended` or `kept`. None: lanes never preempt."""
        self._lent: dict[object, _Loan] = {}
        self._held: Counter[Hashable] = Counter()
        self._waiting: dict[Hashable, list[_Waiter]] = {}
        """Per tenant, in line order."""
        self._suspended: dict[object, _Waiter] = {}
        self._served_at: dict[Hashable, int] = {}
        self._turns = itertools.count()
        self._arrivals = itertools.count()
        self._waits = WaitRecorder()

    @property
    def borrowed_tokens(self) -> int:
        return len(self._lent)

    @property
    def available_tokens(self) -> int:
        return self.total_tokens - len(self._lent)

    def statistics(self) -> LaneStatistics:
        waiting = sum(len(queue) for queue in self._waiting.values())
        suspended = len(self._suspended)
        return LaneStatistics(len(self._lent), self.total_tokens, waiting - suspended, suspended)

    def waiting_for(self, tenant: Hashable) -> int:
        """`tenant`'s arrivals waiting for a lane."""
        return sum(w.resume is None for w in self._waiting.get(tenant, ()))

    def waits(self) -> Mapping[int, WaitStatistics]:
        """Arrivals' waits for a lane, by priority, since the lanes were made."""
        return self._waits.snapshot()

    async def acquire_on_behalf_of(
        self, borrower: object, tenant: Hashable = None, priority: int = 0
    ) -> None:
        """Borrow a lane for `borrower`, waiting (by class, fair across tenants, FIFO within
        one) if none is free. Cancellation: a checkpoint; cancelled while waiting, nothing is
        borrowed (a lane granted in the same moment goes back at once)."""
        if borrower in self._lent or borrower in self._suspended:
            raise RuntimeError("this borrower already holds a lane")
        await trio.lowlevel.checkpoint_if_cancelled()
        order = next(self._arrivals)
        if self.available_tokens > 0 and not self._waiting:
            self._lend(borrower, tenant, priority, priority, order, 0)
            self._waits.record(priority, 0.0)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter(borrower, tenant, priority, order, trio.current_time())
        self._enqueue(waiter)
        self._ask_preemptions()
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():
                self.release_on_behalf_of(borrower)
            else:
                self._forget(waiter)
            raise

    def release_on_behalf_of(self, borrower: object) -> None:
        """Give `borrower`'s lane back; the next waiter (by class, then fairly) gets it. Not a
        checkpoint. Raises RuntimeError if `borrower` holds none."""
        try:
            loan = self._lent.pop(borrower)
        except KeyError:
            raise RuntimeError("this borrower holds no lane") from None
        tenant = loan.tenant
        self._held[tenant] -= 1
        if self._held[tenant] <= 0:
            del self._held[tenant]
            if tenant not in self._waiting:  # a tenant that is gone leaves nothing behind
                self._served_at.pop(tenant, None)
        self._hand_out()

    def suspended(self, borrower: object, resume: Callable[[], None]) -> None:
        """The owner took `borrower` off the device (asked by `preempt`): its lane goes to the
        best waiter, and it waits for one again in its old place in line; `resume()` is
        called once it has one. Not a checkpoint. RuntimeError if it holds no lane."""
        loan = self._lent.get(borrower)
        if loan is None:
            raise RuntimeError("this borrower holds no lane")
        waiter = _Waiter(
            borrower, loan.tenant, loan.priority, loan.order, trio.current_time(),
            resume=resume, preemptions=loan.preemptions + 1,
        )  # fmt: skip
        # In line before its lane is given back: with no better waiter, it has it again.
        self._enqueue(waiter)
        self._suspended[borrower] = waiter
        self.release_on_behalf_of(borrower)

    def kept(self, borrower: object) -> None:
        """The owner could not take `borrower` off the device: it is not asked again while it
        holds this lane, and another may be. Not a checkpoint; a no-op if it holds none."""
        loan = self._lent.get(borrower)
        if loan is not None:
            loan.asked, loan.kept = False, True
            self._ask_preemptions()

    def withdraw(self, borrower: object) -> None:
        """`borrower` is gone (its owner confirmed it computes nothing more): its lane goes
        back, or its place in line if it waits after a suspension. Not a checkpoint.
        RuntimeError if it has neither."""
        waiter = self._suspended.pop(borrower, None)
        if waiter is None:
            self.release_on_behalf_of(borrower)
        else:
            self._forget(waiter)

    def _lend(
        self, borrower: object, tenant: Hashable, priority: int, rank: int, order: int, yields: int
    ) -> None:
        self._lent[borrower] = _Loan(tenant, priority, rank, order, yields)
        self._held[tenant] += 1
        self._served_at[tenant] = next(self._turns)

    def _hand_out(self) -> None:
        while self.available_tokens > 0 and self._waiting:
            waiter = self._next()
            self._forget(waiter)
            self._suspended.pop(waiter.borrower, None)
            rank = self._rank(waiter)
            for other in self._all_waiting():
                other.passed += other.priority > waiter.priority
            b = waiter.borrower
            self._lend(b, waiter.tenant, waiter.priority, rank, waiter.order, waiter.preemptions)
            if waiter.resume is not None:
                waiter.resume()
            else:
                self._waits.record(waiter.priority, trio.current_time() - waiter.since)
                waiter.granted.set()
        self._ask_preemptions()

    def _next(self) -> _Waiter:
        """The waiter a free lane goes to: the best class, then the tenant holding fewest
        lanes (ties: served least recently), then the first in line."""
        best = min(self._rank(w) for w in self._all_waiting())
        firsts = {
            tenant: next(w for w in queue if self._rank(w) == best)
            for tenant, queue in self._waiting.items()
            if any(self._rank(w) == best for w in queue)
        }
        tenant = min(firsts, key=lambda t: (self._held[t], self._served_at.get(t, -1)))
        return firsts[tenant]

    def _ask_preemptions(self) -> None:
        """While no lane is free: for each waiter, best first, past those that lanes already
        asked for will serve, ask for a running borrower of a worse class to be taken off the
        device (the worst class, newest first), until one has none."""
        if self.preempt is None or self.available_tokens > 0 or not self._waiting:
            return
        asked = sum(loan.asked for loan in self._lent.values())
        line = sorted((self._rank(w), w.order) for w in self._all_waiting())
        for rank, _ in line[asked:]:
            victim = self._victim(rank)
            if victim is None:
                return
            self._lent[victim].asked = True
            self.preempt(victim)

    def _victim(self, rank: int) -> object | None:
        limit = self.policy.max_preemptions
        eligible = [
            (loan.rank, loan.order, borrower)
            for borrower, loan in self._lent.items()
            if loan.rank > rank and not (loan.asked or loan.kept) and loan.preemptions < limit
        ]
        return max(eligible, key=lambda e: (e[0], e[1]))[2] if eligible else None

    def _rank(self, waiter: _Waiter) -> int:
        return self.policy.rank(waiter.priority, waiter.passed)

    def _all_waiting(self) -> Iterator[_Waiter]:
        for queue in self._waiting.values():
            yield from queue

    def _enqueue(self, waiter: _Waiter) -> None:
        queue = self._waiting.setdefault(waiter.tenant, [])
        bisect.insort(queue, waiter, key=lambda w: w.order)

    def _forget(self, waiter: _Waiter) -> None:
        queue = self._waiting.get(waiter.tenant)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._waiting[waiter.tenant]
