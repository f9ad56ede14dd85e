"""Dropping a stream's connection on purpose: the scripted model's `drop_after` fault and
`--fault drop_after:N`, so that a client's handling of a connection lost mid-stream can be
tested against the real server.

The stream's body yields `http.DROP_CONNECTION` where the cut goes (`http/_pump.py`); this
ASGI wrapper, around the app (the harness's `wrap`), forwards nothing from then on, not even
the body's end. The app returns normally, and Hypercorn, finding the response unfinished,
closes the connection: the client sees a chunked body that never ends (no error event, no
`[DONE]`), as when a server or a proxy dies mid-stream. Nothing is logged as an error.
"""

from __future__ import annotations

from typing import Any

from ..http import DROP_CONNECTION
from ..serving import ASGIApp


class ConnectionDrops:
    """ASGI wrapper: after a body message that is `DROP_CONNECTION`, send nothing more."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        dropped = False

        async def send_until_dropped(message: dict[str, Any]) -> None:
            nonlocal dropped
            if message["type"] == "http.response.body" and message.get("body") == DROP_CONNECTION:
                dropped = True
            if not dropped:
                await send(message)

        await self.app(scope, receive, send_until_dropped)
