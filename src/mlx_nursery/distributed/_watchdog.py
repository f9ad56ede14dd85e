"""The bound on every collective: no rank waits forever for another.

MLX's collectives (`all_sum`, `all_gather`) block until every rank has joined them; a rank
that died or stalls would leave the others waiting for ever (as mlx-lm's server does). Each
rank arms the watchdog around everything that waits on the others (a broadcast, a step),
and a thread of its own ends the process, non-zero, once one has waited past the bound:
after `on_stall` (rank 0: /health turns 503 and in-flight requests end) has run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("mlx_nursery.distributed")

STALL_EXIT_STATUS = 3
"""The exit status of a rank whose group stalled (distinct from a load failure's 1, 2)."""

FIRST_MEETING_S = 1800.0
"""The bound on the ranks' first meeting (the model check), instead of the step bound:
each rank reaches it after loading its shard and hashing the model's files at its own
disk's pace, minutes for a large model, so ranks arrive far apart. Rank 0's /health says
"loading" meanwhile; a rank that never arrives still ends the group."""


class Watchdog:
    """Exits the process when an armed wait outlasts `timeout` seconds."""

    def __init__(
        self,
        timeout: float,
        describe: Callable[[str, float], str],
        *,
        on_stall: Callable[[str], None] | None = None,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.timeout = timeout
        self._describe = describe
        """The message for a stalled wait, from what was waited for and the bound."""
        self.on_stall = on_stall
        """Run (bounded by the caller) before the exit: rank 0 reports and ends requests."""
        self._exit = exit
        self._lock = threading.Lock()
        self._armed: tuple[str, float, float] | None = None
        """What is waited for, since when, and the bound it was armed with."""
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="mlx-nursery-watchdog", daemon=True
        )
        self._thread.start()

    @contextmanager
    def watching(self, what: str) -> Iterator[None]:
        """Arm for the block (waits on the other ranks); not reentrant."""
        with self._lock:
            self._armed = (what, time.monotonic(), self.timeout)
        try:
            yield
        finally:
            with self._lock:
                self._armed = None

    @contextmanager
    def at_least(self, seconds: float) -> Iterator[None]:
        """Within the block the bound is at least `seconds` (the first meeting)."""
        usual = self.timeout
        self.timeout = max(usual, seconds)
        try:
            yield
        finally:
            self.timeout = usual

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        period = min(0.25, self.timeout / 4)
        while not self._stop.wait(period):
            with self._lock:
                armed = self._armed
            # The bound the wait was armed with: a bound changed meanwhile (`at_least`,
            # patience) is not this wait's.
            if armed is None or time.monotonic() - armed[1] < armed[2]:
                continue
            detail = self._describe(armed[0], armed[2])
            log.error("%s; exiting with status %d", detail, STALL_EXIT_STATUS)
            if self.on_stall is not None:
                try:
                    self.on_stall(detail)
                except Exception:  # the exit must come regardless
                    log.exception("reporting the stalled group failed")
            for handler in logging.getLogger().handlers:
                handler.flush()
            self._exit(STALL_EXIT_STATUS)
            return
