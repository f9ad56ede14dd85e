"""ASGI wrapper that makes Hypercorn's keep-alive timeout work under Quart-Trio.

Seen with hypercorn 0.18 (trio worker) + quart-trio 0.12: after a response,
the final `http.disconnect` cancels the request's nursery while Hypercorn is
still inside the last body send, which is where it re-arms its idle timer.
The timer is then never re-armed: `keep_alive_timeout` is ignored and an idle
keep-alive client holds a graceful shutdown for its whole grace period.
Shielding that one final send lets it complete.

Every body write passes here, so the `sse_write` fault point (`fault_points`) is here too:
a test's failure while the body is written. So does the cut of a body that failed midway
with no place for an error (raw audio, `_speech_routes.py`): after a `DROP_CONNECTION`
body message nothing more is forwarded, the app returns normally, and Hypercorn, finding
the response unfinished, closes the connection (nothing logged as an error).
"""

from __future__ import annotations

from typing import Any

import trio

from .. import fault_points
from ._pump import DROP_CONNECTION

ASGIApp = Any


class ShieldFinalBody:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        dropped = False

        async def send_shielding_last(message: dict[str, Any]) -> None:
            nonlocal dropped
            if dropped:
                return
            if message["type"] == "http.response.body" and message.get("body") == DROP_CONNECTION:
                dropped = True  # the body is cut here: not even its end goes out
                return
            if message["type"] == "http.response.body" and message.get("body"):
                fault_points.reach("sse_write")  # a test's failure while writing the body
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await self.app(scope, receive, send_shielding_last)
