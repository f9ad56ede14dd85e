"""Supported statistics of cancellation, read through `Engine.statistics()`.

What a benchmark or an operator wants to know about cancellations, measured where they
happen (on the Trio side, as each confirmation arrives) rather than by patching the engine:
how long each cancel took to be confirmed, and how many engine steps ran between the
cancel's request and its confirmation (the design bound is the one step in flight).
"""

from __future__ import annotations

import bisect

import attrs

CONFIRMATION_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)
"""Upper bounds in seconds (Prometheus style: each bucket counts observations <= its bound;
the last count is everything above the last bound)."""

MAX_STEPS_COUNTED = 4
"""Steps in flight are counted exactly up to this; more are counted together at its index."""


@attrs.frozen
class CancelStatistics:
    """Cancellations confirmed since the engine started."""

    confirmed: int
    seconds_total: float
    """Sum of cancel-to-confirmation latencies."""
    seconds_buckets: tuple[float, ...]
    seconds_counts: tuple[int, ...]
    """Per bucket, not cumulative: `seconds_counts[i]` latencies fell in (bound[i-1], bound[i]];
    the last entry counts those above the last bound."""
    steps_in_flight: tuple[int, ...]
    """`steps_in_flight[k]`: cancels confirmed after k engine steps completed (the last entry:
    `MAX_STEPS_COUNTED` or more)."""

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile (None if none is confirmed;
        infinity if it lies past the last bound)."""
        if not self.confirmed:
            return None
        rank, seen = q * self.confirmed, 0
        for bound, count in zip(
            (*self.seconds_buckets, float("inf")), self.seconds_counts, strict=True
        ):
            seen += count
            if seen >= rank:
                return bound
        return float("inf")


class CancelRecorder:
    """Accumulates `CancelStatistics` (Trio thread only)."""

    def __init__(self) -> None:
        self._counts = [0] * (len(CONFIRMATION_BUCKETS) + 1)
        self._steps = [0] * (MAX_STEPS_COUNTED + 1)
        self._total = 0.0

    def record(self, seconds: float, steps: int | None) -> None:
        self._counts[bisect.bisect_left(CONFIRMATION_BUCKETS, seconds)] += 1
        self._total += seconds
        if steps is not None:
            self._steps[min(max(steps, 0), MAX_STEPS_COUNTED)] += 1

    def snapshot(self) -> CancelStatistics:
        return CancelStatistics(
            confirmed=sum(self._counts),
            seconds_total=self._total,
            seconds_buckets=CONFIRMATION_BUCKETS,
            seconds_counts=tuple(self._counts),
            steps_in_flight=tuple(self._steps),
        )
