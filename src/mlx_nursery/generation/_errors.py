"""The server's one error tree, each error with the HTTP status and envelope fields OpenAI
uses (named `OpenAIError` for that envelope; the Anthropic API renders the same errors in its
own, and the HTTP layer raises them for server-wide refusals such as 409 and 503). Engine
errors become these through one map (`_engine_errors`).

Messages quote client values only through `quoted` (a short prefix), and every message and
`param` is cut at a bound as well: an error never echoes a large body back.
"""

from __future__ import annotations

import reprlib
from typing import Any

QUOTE_CHARS = 80
"""Characters of a client value an error message quotes; longer values end with "…"."""
MESSAGE_CHARS = 2000
"""A backstop for whole messages (and params), whatever they quote."""

_REPR = reprlib.Repr()  # keyword arguments only from Python 3.12
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 2, 4, 4
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = QUOTE_CHARS


def shortened(text: str, limit: int = QUOTE_CHARS) -> str:
    """`text` cut to `limit` characters, with "…" when something was cut."""
    return text if len(text) <= limit else text[:limit] + "…"


def quoted(value: Any) -> str:
    """A client value as an error message quotes it: its repr, at most `QUOTE_CHARS` long.

    Bounded work whatever the value's size: a string is cut before it is repr'd, containers
    through `reprlib`."""
    if isinstance(value, str):
        if len(value) <= QUOTE_CHARS:
            return repr(value)
        return repr(value[:QUOTE_CHARS]) + "…"
    return shortened(_REPR.repr(value))


class OpenAIError(Exception):
    status = 500
    type = "server_error"
    retry_after: float | None = None
    """Seconds a client should wait before retrying (the Retry-After header); None: none."""
    should_retry: bool | None = None
    """The `x-should-retry` header the SDKs obey before their own rule (they retry 408, 409,
    429 and 5xx); None sends none."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        message = shortened(message, MESSAGE_CHARS)
        super().__init__(message)
        self.message = message
        self.param = None if param is None else shortened(param, MESSAGE_CHARS)
        self.code = code

    def envelope(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(OpenAIError):
    status = 400
    type = "invalid_request_error"


class RequestTooLarge(OpenAIError):
    status = 413
    type = "invalid_request_error"


class UnsupportedMediaType(OpenAIError):
    status = 415
    type = "invalid_request_error"


class URITooLong(OpenAIError):
    status = 414
    type = "invalid_request_error"


class HeadersTooLarge(OpenAIError):
    status = 431
    type = "invalid_request_error"


class Forbidden(OpenAIError):
    """The key is right but does not open this route (the admin routes)."""

    status = 403
    type = "invalid_request_error"


class Conflict(OpenAIError):
    """The resource is in a state that forbids the change (a model busy with requests)."""

    status = 409
    type = "invalid_request_error"


class ModelNotFound(OpenAIError):
    status = 404
    type = "invalid_request_error"


class ResourceNotFound(OpenAIError):
    status = 404
    type = "invalid_request_error"


class Overloaded(OpenAIError):
    """Retry later: nothing was computed. Carries Retry-After."""

    status = 503
    type = "server_error"
    retry_after: float | None = 1


class RateLimited(OpenAIError):
    """Too much of a caller's work at once (a cap on work that outlives its requests, such
    as background responses): retry once some of it has ended. OpenAI's 429."""

    status = 429
    type = "requests"
    retry_after: float | None = 1

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="rate_limit_exceeded")


class Unavailable(OpenAIError):
    """The server is shutting down or its engine stopped: another replica, or this one in a
    moment, may serve it (Retry-After)."""

    status = 503
    type = "server_error"
    retry_after: float | None = 1


class RequestTimeout(OpenAIError):
    """The request's deadline passed. Not retried blindly by SDKs (x-should-retry: false)."""

    status = 504
    type = "timeout_error"
    should_retry = False


class RequestCancelled(OpenAIError):
    """A client cancelled the request by its id (`POST /v1/requests/{id}/cancel`). 409: the
    request conflicts with what its owner asked for since; a 4xx, the server did nothing
    wrong. Not retried by SDKs (x-should-retry: false), which would otherwise retry a 409:
    a retry would undo the cancel."""

    status = 409
    type = "invalid_request_error"
    should_retry = False


class ClientTooSlow(OpenAIError):
    """A stream's client fell further behind the model than the engine buffers for one
    request (`max_buffered_events`; only a request that may write more than that can), so
    the server stopped the generation rather than buffer without bound. The client's doing,
    as a disconnect is: counted as a client cancel, not a server failure; a retry that reads
    at the same pace ends the same way. Only ever an in-stream error (the status is 200)."""

    status = 408
    type = "invalid_request_error"
    should_retry = False


class FaultStatus(OpenAIError):
    """A fault a test harness asked for (a script's, or `--fault-rate`'s): the request is
    answered with `status` (429, 500 or 503) before any work; 429 as OpenAI's rate limit."""

    def __init__(self, status: int, message: str, *, code: str, retry_after: float | None) -> None:
        super().__init__(message, code="rate_limit_exceeded" if status == 429 else code)
        self.status = status
        self.type = "requests" if status == 429 else "server_error"
        self.retry_after = retry_after


class ConnectionDropped(OpenAIError):
    """Not sent on a stream: the HTTP layer cuts its connection where this would go (a test
    harness's fault: the scripted model's `drop_after`, `--fault drop_after:N`)."""

    status = 500
    type = "server_error"


class GenerationFailed(OpenAIError):
    """The engine failed this request; details are logged, not returned."""

    status = 500
    type = "server_error"
