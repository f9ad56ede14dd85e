"""Limits on the request line and headers, answered in OpenAI's envelope.

Hypercorn refuses a request head (request line and headers) larger than its
`h11_max_incomplete_size` by itself: a 431 with an empty body, which no OpenAI client can
read. So Hypercorn's limit is set well above ours (`HYPERCORN_HEAD_BYTES`), and this ASGI
wrapper applies ours before the app sees the request: 414 for a URL longer than
`MAX_URL_BYTES`, 431 for headers larger than `MAX_HEADER_BYTES`, each in the envelope.
Beyond Hypercorn's limit the answer stays Hypercorn's.

It also answers what the app does not serve, before the app sees it: a WebSocket handshake
(no route takes one) gets a 404 in the envelope through ASGI's WebSocket denial response,
where Quart would answer a 500 and log a traceback; and a request in HTTP/2 over cleartext
(h2c), which `mlx-nursery serve` never speaks (`_connections.py`) but Hypercorn's own CLI
would, a 505 (docs/deployment.md, "Security model", says why).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from ..generation import HeadersTooLarge, OpenAIError, URITooLong

MAX_URL_BYTES = 8 * 1024
"""Path and query string: no route of ours needs more than a few hundred bytes."""
MAX_HEADER_BYTES = 16 * 1024
"""All header names and values together: Hypercorn's own default for the whole head."""
HYPERCORN_HEAD_BYTES = 64 * 1024
"""Hypercorn's `h11_max_incomplete_size`: room for both of ours, then its own 431."""

ASGIApp = Any


class RequestLimits:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_url_bytes: int = MAX_URL_BYTES,
        max_header_bytes: int = MAX_HEADER_BYTES,
    ) -> None:
        self.app = app
        self.max_url_bytes = max_url_bytes
        self.max_header_bytes = max_header_bytes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await refuse_websocket(scope, receive, send)
            return
        error = self._refusal(scope) if scope["type"] == "http" else None
        if error is None:
            await self.app(scope, receive, send)
            return
        body = json.dumps(error.envelope()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", f"req_{secrets.token_hex(12)}".encode()),
                    # The body is left unread: say the connection ends, so no client reuses it.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _refusal(self, scope: dict[str, Any]) -> OpenAIError | None:
        if scope["http_version"].startswith("2") and scope["scheme"] == "http":
            return _HTTPVersionNotSupported(
                "HTTP/2 is served over TLS only; send HTTP/1.1", code="http_version_not_supported"
            )
        url = len(scope.get("raw_path") or scope["path"].encode()) + len(scope["query_string"])
        if url > self.max_url_bytes:
            return URITooLong(
                f"the request URL is longer than {self.max_url_bytes} bytes", code="uri_too_long"
            )
        headers = sum(len(name) + len(value) for name, value in scope["headers"])
        if headers > self.max_header_bytes:
            return HeadersTooLarge(
                f"the request headers are larger than {self.max_header_bytes} bytes",
                code="request_headers_too_large",
            )
        return None


class _HTTPVersionNotSupported(OpenAIError):
    status = 505
    type = "invalid_request_error"


async def refuse_websocket(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answer a WebSocket handshake with a 404 in the envelope (no route of ours takes a
    WebSocket), through ASGI's denial response, which Hypercorn supports; where a server has
    no such extension, a close before accepting (a 403 from the server). Cancellation: a
    checkpoint; nothing is left open."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return  # the client left before its handshake was handed over
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps(
        {
            "error": {
                "message": "this server takes no WebSocket; its API is HTTP (JSON and SSE)",
                "type": "invalid_request_error",
                "param": None,
                "code": "not_found",
            }
        }
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", f"req_{secrets.token_hex(12)}".encode()),
    ]
    await send({"type": "websocket.http.response.start", "status": 404, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
