"""How the server's logs are written: text for people, or one JSON object per line for log
pipelines (`--log-format json`).

A JSON line holds the time, level, logger and message, and the fields a record carries
as `request` (the request log, `http/_request_log.py`) at the top level. Prompts and
completions never reach a log record: nothing here has to filter them out.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": _iso8601(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "request", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str, *, name: str | None = None) -> None:
    """One handler (stderr), in text or JSON, at `level`: on the root logger (`mlx-nursery
    serve`, which owns the process), or on the logger `name` alone, not propagated (an app
    inside another's process, such as Hypercorn's CLI, whose own loggers keep their handlers
    and whose lines are then not written twice)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    if name is None:
        logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
        return
    logger = logging.getLogger(name)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def _iso8601(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"
