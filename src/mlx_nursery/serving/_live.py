"""Requests a client may cancel by id (`POST /v1/requests/{id}/cancel`), found by whose they
are and their request id while they run.

A request that does work (a generation, an embedding, a transcription) has an entry here,
a `LiveRequest`, from when its route starts until its ASGI call ends. The entry holds what
would stop it: the scope of what its handler does before there is a job (parsing, leasing
the model, preparing, waiting for a lane: `guard`), then its job or embedding call
(`hold`). A cancel stops whichever runs with the reason "cancel": its compute stops within
an engine step, exactly as for a timeout (the job's own scope is cancelled), and the
request ends with `RequestCancelled`, a 409 or its stream's last error event.

Ids are the requests' `x-request-id`s. A client may choose its own (so that it knows the
id of a non-streaming request before its answer comes); two running requests of one tenant
with the same id are cancelled together. A tenant finds only its own requests, an admin
key every tenant's; another tenant's id is not found, exactly as an id that never existed,
so that ids cannot be probed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import attrs
import trio

from ..generation import request_cancelled
from ._job import CancelReason
from ._request_log import RequestRecord
from ._tenant import Tenant


class Stoppable(Protocol):
    """A request's work that a cancel stops: a `Job`, an embedding call."""

    @property
    def over(self) -> bool:
        """Whether its compute has ended (a cancel would change nothing)."""

    def cancel(self, reason: CancelReason) -> None: ...


@attrs.define(eq=False)
class LiveRequest:
    """One request's entry: what a cancel by its id stops now."""

    tenant: str | None
    request_id: str
    record: RequestRecord | None = None
    cancelled: bool = False
    """A cancel came: whatever the request starts from now on is stopped at once."""
    _scopes: list[trio.CancelScope] = attrs.Factory(list)
    _parts: list[Stoppable] = attrs.Factory(list)
    _began: bool = False

    @property
    def over(self) -> bool:
        """Whether the request's work is done: it began, and nothing of it runs now."""
        return self._began and not self._scopes and all(part.over for part in self._parts)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Run the block so that a cancel of this request stops it; it then raises
        `RequestCancelled` in place of the `Cancelled` that stopped it. Not a checkpoint;
        a cancel that came before the block stops it at its first checkpoint."""
        self._began = True
        with trio.CancelScope() as scope:
            if self.cancelled:
                scope.cancel()
            self._scopes.append(scope)
            try:
                yield
            finally:
                self._scopes.remove(scope)
        if scope.cancelled_caught:
            if self.record is not None:
                self.record.cancel_cause = "cancel"
            raise request_cancelled(self.request_id)

    def hold(self, part: Stoppable) -> None:
        """`part` is this request's work until it is over: a cancel stops it (at once, if
        one came already). Not a checkpoint."""
        self._began = True
        self._parts.append(part)
        if self.cancelled:
            part.cancel("cancel")

    def cancel(self) -> bool:
        """Stop the request: its running work, else what its handler does. False if its
        work was over already (nothing to stop). Not a checkpoint."""
        if self.over:
            return False
        self.cancelled = True
        running = [part for part in self._parts if not part.over]
        for part in running:
            part.cancel("cancel")
        if not running:  # a part raises its own error through the guard around it
            for scope in self._scopes:
                scope.cancel()
        return True


class LiveRequests:
    """The server's running requests by id (one registry for every model and route)."""

    def __init__(self) -> None:
        self._by_id: dict[str, list[LiveRequest]] = {}

    def enter(
        self, tenant: str | None, request_id: str, record: RequestRecord | None = None
    ) -> LiveRequest:
        """A new entry for a request, listed until `leave`."""
        live = LiveRequest(tenant, request_id, record)
        self._by_id.setdefault(request_id, []).append(live)
        return live

    def leave(self, live: LiveRequest) -> None:
        """`live`'s request has ended: it is no longer found."""
        entries = self._by_id.get(live.request_id, [])
        if live in entries:
            entries.remove(live)
        if not entries:
            self._by_id.pop(live.request_id, None)

    def cancel(self, tenant: Tenant, request_id: str) -> bool:
        """Cancel `tenant`'s running requests with this id (an admin's: anyone's). False
        when none runs: none has the id, each that has it is over, or it is another
        tenant's. Not a checkpoint."""
        found = [live for live in self._by_id.get(request_id, ()) if tenant.owns(live.tenant)]
        stopped = [live.cancel() for live in found]  # every one, whatever the first said
        return any(stopped)

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_id.values())
