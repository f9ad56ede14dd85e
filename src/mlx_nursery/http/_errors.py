"""Every error in its API's envelope (OpenAI's; Anthropic's on the Messages routes), with
the headers that steer SDK retries.

- 503 queue full: `Retry-After` (the SDK waits that long, then retries: right, nothing ran).
  Any error with a `retry_after` carries it (the scripted model's 429 and 503 faults too): in
  whole seconds, as HTTP has it, and also as `retry-after-ms` when it is not whole (the
  openai SDKs read that first), so that a test of retries need not wait whole seconds.
- 504 request timeout, 409 request cancelled: `x-should-retry: false` (the SDK would
  otherwise retry a 5xx or a 409 and run the same request again).
- 500: a generic message; details go to the log with the request id, never to the client.
  The log names the exception's type and where it was raised, not its message, which may
  quote the prompt (prompts and completions are never logged).

An error is answered after the rest of the request's body is read (app.py), so that a
keep-alive client can send its next request on the connection; except where the body is
not worth waiting for (`leave_body_unread`: a request without a key, a body of the wrong
type), which is answered at once, the connection closed after it.
"""

from __future__ import annotations

import json
import math

from quart import Response, g, has_request_context

from ..anthropic import error_body, error_status
from ..generation import OpenAIError


def error_response(error: OpenAIError, *, anthropic: bool = False) -> Response:
    """The error's response: OpenAI's envelope, or Anthropic's (`anthropic`: a Messages API
    route), with the headers either way."""
    headers: dict[str, str] = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(math.ceil(error.retry_after))
        if error.retry_after != math.ceil(error.retry_after):
            headers["retry-after-ms"] = str(round(error.retry_after * 1000))
    if error.should_retry is not None:
        headers["x-should-retry"] = "true" if error.should_retry else "false"
    if anthropic:
        status, body = error_status(error), error_body(error, _request_id())
    else:
        status, body = error.status, error.envelope()
    return Response(
        json.dumps(body), status=status, headers=headers, content_type="application/json"
    )


def envelope_response(
    status: int, message: str, type_: str, code: str | None, *, anthropic: bool = False
) -> Response:
    """An error the app answers itself (401, 404, ...), in the route's API's envelope."""
    if anthropic:
        return error_response(_Plain(message, status=status, code=code), anthropic=True)
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return Response(json.dumps(body), status=status, content_type="application/json")


class _Plain(OpenAIError):
    def __init__(self, message: str, *, status: int, code: str | None) -> None:
        super().__init__(message, code=code)
        self.status = status


def leave_body_unread() -> None:
    """Answer the current request without reading the rest of its body: a client without a
    key, or whose body cannot serve, must not hold the connection for as long as it takes
    to send one (or to not send it). The connection is closed after the answer where a
    body was announced (app.py), so that no client sends a request after an unread body."""
    g.body_left_unread = True


def body_left_unread() -> bool:
    """Whether the current request is answered without reading its body."""
    return bool(getattr(g, "body_left_unread", False))


def _request_id() -> str | None:
    return getattr(g, "request_id", None) if has_request_context() else None
