"""An unexpected failure: its log line (type and traceback, never its message) and the
generic 500 the client gets in its stead, with the request id to find the log by."""

from __future__ import annotations

import logging
import traceback

from ..generation import OpenAIError
from ..logs import Verbatim

log = logging.getLogger("mlx_nursery.http")


def internal_error(request_id: str) -> OpenAIError:
    return OpenAIError(f"internal server error (request id {request_id})", code="internal_error")


def log_failure(request_id: str, what: str, error: BaseException) -> None:
    """Log an unexpected failure: its type and traceback, without its message."""
    where = "".join(traceback.format_tb(error.__traceback__))
    log.error(
        "request %s failed %s with %s:\n%s",
        request_id,
        what,
        type(error).__name__,
        Verbatim(where.rstrip()),  # the frames of our code: their lines kept
    )
