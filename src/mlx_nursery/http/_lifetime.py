"""A request's jobs end with the request: cancelled when its ASGI task ends, however it ends.

Why the ASGI task and not the response body generator's `finally`: Quart-Trio cancels a
request when its client leaves, and if that happens before the first body byte (while
the head is being sent), the generator has never run, so no code of it ever runs, its
`finally` included. The job then computed on until the engine gave up on it as a consumer
that stopped reading, about a thousand tokens later (`tests/http/test_http_lifecycle.py`).
Quart's `teardown_request` is no use either: it runs when the handler returns, before a
streamed body is sent.

So the app handles each HTTP request with `LifetimeHTTPConnection`, which owns a
`RequestLifetime` for the request's whole ASGI call (handler, head, body), and a route ties
each job it starts to it with `own`. It also holds the request's body to its pace
(`_body_pace.py`).
"""

from __future__ import annotations

from contextvars import ContextVar

import attrs
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, HTTPScope
from quart_trio.asgi import TrioASGIHTTPConnection

from ..serving import Job, LiveRequest, LiveRequests, RequestRecord
from ._body_pace import PacedBody

_current: ContextVar[RequestLifetime | None] = ContextVar(
    "mlx_nursery_request_lifetime", default=None
)


@attrs.define(eq=False)
class RequestLifetime:
    """The jobs one request started; cancelled ("client") when the request ends. And the
    request's log record, written once the request and its jobs have ended, and its entry
    among the requests a client may cancel by id, listed until it ends."""

    record: RequestRecord
    registry: LiveRequests
    jobs: list[Job] = attrs.Factory(list)
    live: LiveRequest | None = None

    def end(self) -> None:
        """Cancel every job still running: no one will read its output. Not a checkpoint."""
        if self.live is not None:
            self.registry.leave(self.live)
        for job in self.jobs:
            job.cancel("client")


def current_record() -> RequestRecord | None:
    """The log record of the request being handled (None outside one)."""
    lifetime = _current.get()
    return None if lifetime is None else lifetime.record


def live_request(tenant: str | None, request_id: str) -> LiveRequest:
    """The current request's entry among those a client may cancel by id (`tenant`'s, under
    `request_id`): listed on first use, until the request ends."""
    lifetime = _current.get()
    if lifetime is None:
        raise RuntimeError("no request lifetime: the app must use LifetimeHTTPConnection")
    if lifetime.live is None:
        lifetime.live = lifetime.registry.enter(tenant, request_id, lifetime.record)
    return lifetime.live


def logged_path(scope: HTTPScope) -> str:
    """The request's path as logged: as it came, percent-encoded (the decoded one may hold
    spaces, newlines or control characters that would forge log lines)."""
    raw = scope.get("raw_path")
    return raw.decode("ascii", "backslashreplace") if raw else scope["path"]


def own(job: Job) -> Job:
    """Tie `job` to the current request, so that it is cancelled when the request ends."""
    lifetime = _current.get()
    if lifetime is None:
        raise RuntimeError("no request lifetime: the app must use LifetimeHTTPConnection")
    lifetime.jobs.append(job)
    return job


class LifetimeHTTPConnection(TrioASGIHTTPConnection):
    """Quart-Trio's HTTP connection, which ends the request's lifetime when its call ends.

    The lifetime reaches the handler through a context variable: Quart-Trio runs the handler
    in a task spawned inside this call, and a Trio task starts with a copy of its spawner's
    context. The body's pace comes from the app's config (app.py)."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        parts = self.app.extensions["mlx_nursery"]
        record = RequestRecord(self.scope["method"], logged_path(self.scope))
        lifetime = RequestLifetime(record, parts.live)
        config, metrics = self.app.config, parts.metrics
        paced = PacedBody(
            receive,
            send,
            lifetime.record,
            timeout=config["PACED_BODY_TIMEOUT"],
            min_rate=config["PACED_BODY_MIN_RATE"],
            on_refused=metrics.refused.labels("body_timeout").inc,
        )
        token = _current.set(lifetime)
        try:
            await super().__call__(paced.receive, paced.send)
        finally:
            _current.reset(token)
            lifetime.end()
            lifetime.record.part_ended()
