"""Priorities on the Trio side: the policy that keeps them starvation-free, and the waits
for a lane recorded per priority.

A request's priority is an integer, lower first (vLLM's convention). Its class is what the
lanes order by: its priority, less one for every `PriorityPolicy.aging` lanes granted, while
it waits, to requests of a better priority than its own. Counting admissions rather than
seconds makes aging a property of the load (a burst of better requests, however fast, lets
a waiting one through after a known number of them) and keeps it deterministic to test. A
running request keeps the class it was admitted with; a waiting one of a better class may
take its lane, at most `max_preemptions` times per request, so that a request admitted
`max_preemptions + 1` times runs to its end (docs/decisions/0044-priorities.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

import attrs
from attrs import validators as v

WAIT_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
)
"""Upper bounds in seconds of the waits for a lane (Prometheus style: the last count is
everything above the last bound)."""


@attrs.frozen
class PriorityPolicy:
    """How priorities order lanes and when one request yields its lane to another."""

    aging: int = attrs.field(default=8, validator=v.ge(1))
    """Lanes granted to requests of a better priority, while one waits, that improve its
    class by one: a request of priority p behind a stream of priority q < p is admitted
    after at most `aging * (p - q)` of them (and after those waiting before it in its class)."""
    max_preemptions: int = attrs.field(default=2, validator=v.ge(0))
    """Times one request may be taken off the device for a request of a better class (its
    lane, or its KV memory); 0: never (priorities then only order the waits)."""

    def rank(self, priority: int, passed: int) -> int:
        """The class of a request of `priority` that `passed` better ones were admitted
        before while it waited."""
        return priority - passed // self.aging


@attrs.frozen
class WaitStatistics:
    """The waits for a lane of one priority's requests (a request that found a lane free
    waited 0 s; a request resumed after a preemption is not counted again)."""

    buckets: tuple[float, ...]
    counts: tuple[int, ...]
    """Per bucket, not cumulative: `counts[i]` waits fell in (bound[i-1], bound[i]]; the last
    entry counts those above the last bound."""
    seconds_total: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class WaitRecorder:
    """Accumulates `WaitStatistics` per priority (Trio thread only). Priorities are bounded
    (`PRIORITY_LIMIT`), so the map is too."""

    def __init__(self) -> None:
        self._counts: dict[int, list[int]] = {}
        self._totals: dict[int, float] = {}

    def record(self, priority: int, seconds: float) -> None:
        counts = self._counts.setdefault(priority, [0] * (len(WAIT_BUCKETS) + 1))
        counts[bisect.bisect_left(WAIT_BUCKETS, seconds)] += 1
        self._totals[priority] = self._totals.get(priority, 0.0) + seconds

    def snapshot(self) -> Mapping[int, WaitStatistics]:
        return {
            priority: WaitStatistics(WAIT_BUCKETS, tuple(counts), self._totals[priority])
            for priority, counts in sorted(self._counts.items())
        }
