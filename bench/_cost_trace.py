"""What speculation's control measured and chose, step by step: a probe for
`bench/speculative.py --trace-costs`, kept out of the engine.

It wraps, class-wide, the engine's `VerifyCosts` (each timed sample of a plain step or a
verify, and the estimate it leaves) and `DraftControl.drafts` (each step's choice), times
every engine's plain reads in a row (`off`'s too: a plain step's cost measured alike for
every variant), and files every event under the run in progress (`TRACE.current`, set by
the bench before each request). The summary says, per workload and variant: how many steps
drafted how much, each length's samples (median, mean, 90th percentile: a mean far above
the estimate means the control learned from the typical verify and not from its tail), the
estimates the run ended with, and the plain reads' median.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections import Counter, defaultdict
from typing import Any

from mlx_nursery.engine._drafting import DraftControl, VerifyCosts
from mlx_nursery.engine._solo_sequence import SoloSequence


class Trace:
    def __init__(self) -> None:
        self.current = ("", "")
        self.samples: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self.untimed: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
        self.choices: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
        self.estimates: dict[tuple[str, str], dict[str, float | None]] = {}
        self.reads: dict[tuple[str, str], list[float]] = defaultdict(list)
        """Every engine's (`off`'s too) intervals between two plain reads in a row of one
        sequence, the second with no verify launched before it: what a plain step costs
        each variant, measured alike."""
        self._last_read: dict[int, tuple[float, bool]] = {}

    def install(self) -> None:
        plain, observed, drafts = VerifyCosts.plain, VerifyCosts.observed, DraftControl.drafts

        @functools.wraps(plain)
        def traced_plain(costs: VerifyCosts, seconds: float) -> None:
            plain(costs, seconds)
            self.samples[self.current][0].append(seconds)
            self._estimate(costs)

        @functools.wraps(observed)
        def traced_observed(
            costs: VerifyCosts, rows: int, drafts: int, seconds: float | None
        ) -> None:
            observed(costs, rows, drafts, seconds)
            if seconds is None:
                self.untimed[self.current][drafts] += 1
            else:
                self.samples[self.current][drafts].append(seconds)
            self._estimate(costs)

        @functools.wraps(drafts)
        def traced_drafts(control: DraftControl) -> int:
            chosen: int = drafts(control)
            self.choices[self.current][chosen] += 1
            return chosen

        take = SoloSequence._take_in_flight

        @functools.wraps(take)
        def traced_take(sequence: SoloSequence, *, launch_next: bool) -> Any:
            response = take(sequence, launch_next=launch_next)
            now = time.perf_counter()
            last = self._last_read.get(id(sequence))
            plain = not sequence._verify  # nothing launched before this read but a plain step
            if last is not None and last[1] and plain:
                self.reads[self.current].append(now - last[0])
            self._last_read[id(sequence)] = (now, plain)
            return response

        take_verify = SoloSequence._take_verify

        @functools.wraps(take_verify)
        def traced_take_verify(sequence: SoloSequence) -> Any:
            self._last_read.pop(id(sequence), None)  # the next plain read follows a verify
            return take_verify(sequence)

        # A probe replaces methods in place, which mypy rightly refuses elsewhere.
        SoloSequence._take_in_flight = traced_take  # type: ignore[assignment, method-assign]
        SoloSequence._take_verify = traced_take_verify  # type: ignore[assignment, method-assign]
        VerifyCosts.plain = traced_plain  # type: ignore[assignment, method-assign]
        VerifyCosts.observed = traced_observed  # type: ignore[assignment, method-assign]
        DraftControl.drafts = traced_drafts  # type: ignore[assignment, method-assign]

    def _estimate(self, costs: VerifyCosts) -> None:
        self.estimates[self.current] = {
            str(k): costs.step_seconds(k) if costs.measured or k == 0 else None for k in range(0, 9)
        } | {"plain": costs.plain_s}

    def summary(self) -> list[dict[str, Any]]:
        rows = []
        for key in sorted(set(self.samples) | set(self.choices) | set(self.reads)):
            lengths = {}
            for k, seconds in sorted(self.samples[key].items()):
                ordered = sorted(seconds)
                lengths[str(k)] = {
                    "n": len(ordered),
                    "median_ms": 1e3 * statistics.median(ordered),
                    "mean_ms": 1e3 * statistics.fmean(ordered),
                    "p90_ms": 1e3 * ordered[math.ceil(0.9 * len(ordered)) - 1],  # nearest rank
                    "max_ms": 1e3 * ordered[-1],
                    "untimed": self.untimed[key][k],
                }
            reads = sorted(self.reads[key])
            rows.append(
                {
                    "plain_reads": {
                        "n": len(reads),
                        "median_ms": 1e3 * statistics.median(reads) if reads else None,
                    },
                    "workload": key[0],
                    "variant": key[1],
                    "choices": dict(sorted(self.choices[key].items())),
                    "samples": lengths,
                    "estimates_ms": {
                        k: None if v is None else 1e3 * v
                        for k, v in self.estimates.get(key, {}).items()
                    },
                }
            )
        return rows

    def print(self) -> None:
        for row in self.summary():
            reads = row["plain_reads"]
            median = "-" if reads["median_ms"] is None else f"{reads['median_ms']:.2f}"
            print(
                f"{row['workload']} {row['variant']}: choices {row['choices']}; plain reads "
                f"in a row: n {reads['n']} median {median} ms"
            )
            for k, s in row["samples"].items():
                estimate = row["estimates_ms"].get("0" if k == "0" else k)
                print(
                    f"  drafts {k}: n {s['n']} (+{s['untimed']} untimed) median "
                    f"{s['median_ms']:.2f} mean {s['mean_ms']:.2f} p90 {s['p90_ms']:.2f} "
                    f"max {s['max_ms']:.1f} ms; estimate at the end "
                    f"{'-' if estimate is None else f'{estimate:.2f}'} ms"
                )


TRACE = Trace()
