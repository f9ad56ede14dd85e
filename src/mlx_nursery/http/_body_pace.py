"""A request body must keep up a pace: a client must not hold a connection (and the request's
memory) by announcing a body and sending it slowly, or never.

The body gets `--body-timeout` seconds from the request head, and one more second per
`--body-min-rate` bytes that arrived: a large upload at a fair rate gets all the time it
needs, a body that stalls gets the timeout. Past its deadline the request is answered 408 in
OpenAI's envelope (unless its response has begun), its connection closed, and the app is
told the client left, which ends the request as a disconnect ends it (its jobs cancelled).

Hypercorn has no such bound (its `read_timeout` is per read, and off by default), and
Quart's `BODY_TIMEOUT` is a fixed deadline that a request waits out only where it reads its
body; this pace applies to every body, read or not, on `mlx-nursery serve` and under
Hypercorn's own CLI alike (`LifetimeHTTPConnection` wraps the app's `receive` with it).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGIReceiveEvent, ASGISendCallable

from ..serving import RequestRecord

BODY_TIMEOUT_CODE = "request_body_timeout"


def body_deadline(started: float, received: int, timeout: float, min_rate: int) -> float:
    """When the next part of a body is due: `timeout` after `started`, plus a second per
    `min_rate` bytes `received` (`min_rate` 0: `timeout` alone)."""
    return started + timeout + (received / min_rate if min_rate else 0.0)


class PacedBody:
    """An HTTP request's ASGI `receive` and `send`, with its body held to its pace."""

    def __init__(
        self,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        record: RequestRecord,
        *,
        timeout: float,
        min_rate: int,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._record = record
        self._timeout = timeout
        self._min_rate = min_rate
        self._on_refused = on_refused
        self._started = trio.current_time()
        self._received = 0
        self._complete = False
        self._responding = False
        self._refused = False

    async def receive(self) -> ASGIReceiveEvent:
        """The next message; a disconnect once the body is past its deadline (after the
        408 is sent). Cancellation: as the server's `receive`, nothing lost."""
        if self._complete:
            return await self._receive()
        deadline = body_deadline(self._started, self._received, self._timeout, self._min_rate)
        with trio.move_on_at(deadline):
            message = await self._receive()
            if message["type"] == "http.request":
                self._received += len(message.get("body", b""))
                self._complete = not message.get("more_body", False)
            else:
                self._complete = True  # a disconnect: nothing more will come
            return message
        await self._refuse()
        return {"type": "http.disconnect"}

    async def send(self, message: Any) -> None:
        """The app's message, unless the request was refused for its pace (then the app is
        being told the client left, and nothing of its answer is wanted)."""
        if self._refused:
            return
        if message["type"] == "http.response.start":
            self._responding = True
        await self._send(message)

    async def _refuse(self) -> None:
        self._refused = True
        self._complete = True
        self._record.status, self._record.error = 408, BODY_TIMEOUT_CODE
        self._on_refused()
        if self._responding:
            return  # too late for a status; the server closes the unfinished response
        rate = f" and {self._min_rate} more bytes a second" if self._min_rate else ""
        body = json.dumps(
            {
                "error": {
                    "message": f"the request body did not arrive in time ({self._timeout:g} s"
                    f"{rate}: --body-timeout, --body-min-rate)",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": BODY_TIMEOUT_CODE,
                }
            }
        ).encode()
        request_id = self._record.request_id
        if request_id == "-":
            request_id = f"req_{secrets.token_hex(12)}"
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()),
            (b"connection", b"close"),
        ]
        with trio.CancelScope(shield=True), trio.move_on_after(_SEND_LIMIT):
            await self._send({"type": "http.response.start", "status": 408, "headers": headers})
            await self._send({"type": "http.response.body", "body": body, "more_body": False})


_SEND_LIMIT = 5.0
"""Seconds the 408 may take to go out: a client that does not read it loses it."""
