"""One log line per request: its id, route, status, model, tokens, durations and how its
generation ended. Never its prompt or its output.

A request's record is filled in where each fact is known: its id and status by the app, its
model by the route, its tokens and finish by its job (`Jobs`). The line is written once the
request's ASGI call and every job it started have ended, whichever ends last: a job cancelled
by a client that left ends after the call, and its cancel cause belongs on the line. The
logger is `mlx_nursery.requests`; the line's fields ride on the log record as `request`, so
that `--log-format json` writes them as fields (`mlx_nursery.logs`). In text, no field can
write a line or a field of its own: the path is logged as it came (percent-encoded), a
client's request id only if it is a plain token (app.py), and the text formatter escapes
control characters in every value.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio

log = logging.getLogger("mlx_nursery.requests")


@attrs.define(eq=False)
class RequestRecord:
    """What the request's log line says; None where it does not apply."""

    method: str
    path: str
    """As it came, percent-encoded (`_lifetime.logged_path`)."""
    started: float = attrs.field(factory=trio.current_time)
    request_id: str = "-"
    status: int | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    cancel_cause: str | None = None
    """Why its generation was stopped: "client", "timeout", "shutdown" or "cancel" (by its
    id: `_live.py`)."""
    error: str | None = None
    """The code of an error its generation ended with after the response began (a stream's
    final error event; the status was sent as 200 before it)."""
    ttft_s: float | None = None
    _open: int = 1
    """The ASGI call, and each job still running."""

    def job_started(self) -> None:
        self._open += 1

    def part_ended(self) -> None:
        """The call or one of its jobs ended; the last to end writes the line."""
        self._open -= 1
        if self._open == 0:
            self._write()

    def fields(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "cancel_cause": self.cancel_cause,
            "error": self.error,
            "ttft_s": _rounded(self.ttft_s),
            "duration_s": _rounded(trio.current_time() - self.started),
        }

    def _write(self) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        fields = self.fields()
        shown = " ".join(
            f"{k}={v}"
            for k, v in fields.items()
            if v is not None and k not in ("request_id", "method", "path", "status")
        )
        log.info(
            "%s %s %s %s %s",
            fields["request_id"],
            self.method,
            self.path,
            self.status if self.status is not None else "-",
            shown,
            extra={"request": fields},
        )


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)
