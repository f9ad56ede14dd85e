"""Device lanes shared fairly among tenants.

A lane is a sequence's place on the device (DESIGN.md: a token of a capacity limiter,
borrowed before admission, returned only once the engine confirms the sequence left).
`trio.CapacityLimiter` hands free lanes out first come, first served: one client that
keeps the queue full makes everyone else wait behind all of its requests. `FairLanes` keeps
the limiter's contract (borrow on behalf of a sequence, cancellable FIFO waits within a
tenant, `statistics()`) and changes only who is served next when a lane frees: the waiting
tenant that holds the fewest lanes, ties to the one served least recently. A tenant is an
opaque name the caller gives (the server's: a digest of the API key); requests without one
are one tenant among the others.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Hashable

import attrs
import trio


@attrs.frozen
class LaneStatistics:
    borrowed_tokens: int
    total_tokens: int
    tasks_waiting: int


@attrs.define(eq=False)
class _Waiter:
    borrower: object
    tenant: Hashable
    granted: trio.Event = attrs.Factory(trio.Event)


class FairLanes:
    """`total` lanes, lent to borrowers; fair among tenants when lanes run short."""

    def __init__(self, total: int) -> None:
        self.total_tokens = total
        self._lent: dict[object, Hashable] = {}
        self._held: Counter[Hashable] = Counter()
        self._waiting: dict[Hashable, deque[_Waiter]] = {}
        self._served_at: dict[Hashable, int] = {}
        self._turns = itertools.count()

    @property
    def borrowed_tokens(self) -> int:
        return len(self._lent)

    @property
    def available_tokens(self) -> int:
        return self.total_tokens - len(self._lent)

    def statistics(self) -> LaneStatistics:
        waiting = sum(len(queue) for queue in self._waiting.values())
        return LaneStatistics(len(self._lent), self.total_tokens, waiting)

    def waiting_for(self, tenant: Hashable) -> int:
        """`tenant`'s borrowers waiting for a lane."""
        return len(self._waiting.get(tenant, ()))

    async def acquire_on_behalf_of(self, borrower: object, tenant: Hashable = None) -> None:
        """Borrow a lane for `borrower`, waiting (FIFO within `tenant`, fair across tenants)
        if none is free. Cancellation: a checkpoint; cancelled while waiting, nothing is
        borrowed (a lane granted in the same moment goes back at once)."""
        if borrower in self._lent:
            raise RuntimeError("this borrower already holds a lane")
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.available_tokens > 0 and not self._waiting:
            self._lend(borrower, tenant)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter(borrower, tenant)
        self._waiting.setdefault(tenant, deque()).append(waiter)
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():
                self.release_on_behalf_of(borrower)
            else:
                self._forget(waiter)
            raise

    def release_on_behalf_of(self, borrower: object) -> None:
        """Give `borrower`'s lane back; the next waiter (fairly chosen) gets it. Not a
        checkpoint. Raises RuntimeError if `borrower` holds none."""
        try:
            tenant = self._lent.pop(borrower)
        except KeyError:
            raise RuntimeError("this borrower holds no lane") from None
        self._held[tenant] -= 1
        if self._held[tenant] <= 0:
            del self._held[tenant]
            if tenant not in self._waiting:  # a tenant that is gone leaves nothing behind
                self._served_at.pop(tenant, None)
        self._hand_out()

    def _lend(self, borrower: object, tenant: Hashable) -> None:
        self._lent[borrower] = tenant
        self._held[tenant] += 1
        self._served_at[tenant] = next(self._turns)

    def _hand_out(self) -> None:
        while self.available_tokens > 0 and self._waiting:
            tenant = min(self._waiting, key=lambda t: (self._held[t], self._served_at.get(t, -1)))
            queue = self._waiting[tenant]
            waiter = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            self._lend(waiter.borrower, tenant)
            waiter.granted.set()

    def _forget(self, waiter: _Waiter) -> None:
        queue = self._waiting.get(waiter.tenant)
        if queue is None:
            return
        queue.remove(waiter)
        if not queue:
            del self._waiting[waiter.tenant]
