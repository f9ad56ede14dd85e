"""When the connections that outlive the accept loop must end (`serve_http`'s grace).

Hypercorn gives them its graceful timeout after the shutdown; an operator's second signal
shortens that to `HURRIED_GRACE`, once the requests it cancelled have decided their answers
(the server's `hurry_trigger`). The cap's shielded writes end by the same deadline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from ._connections import ConnectionCap


HURRIED_GRACE = 1.0
"""Seconds the connections keep after an operator's second signal: the answers already
decided go out; a client that reads slowly is not waited for."""


@attrs.define
class Grace:
    """When the connections that outlive the accept loop must end: the graceful timeout
    after the shutdown, or `HURRIED_GRACE` after a second signal, whichever is sooner."""

    timeout: float
    cap: ConnectionCap
    scope: trio.CancelScope | None = None
    hurried: bool = False
    began: bool = False

    def begin(self) -> None:
        """The accept loop is over: the grace starts. Not a checkpoint."""
        self.began = True
        self._end_by(trio.current_time() + (HURRIED_GRACE if self.hurried else self.timeout))

    async def hurry_on(self, trigger: Callable[[], Awaitable[None]]) -> None:
        """Wait for `trigger`, then shorten the grace (now, or when it begins).
        Cancellation: nothing changes."""
        await trigger()
        self.hurried = True
        if self.began:
            self._end_by(trio.current_time() + HURRIED_GRACE)

    def _end_by(self, deadline: float) -> None:
        assert self.scope is not None
        self.scope.deadline = min(self.scope.deadline, deadline)
        self.cap.writes_end_by(self.scope.deadline)
