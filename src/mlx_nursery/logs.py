"""How the server's logs are written: text for people, or one JSON object per line for log
pipelines (`--log-format json`).

A JSON line holds the time, level, logger and message, and the fields a record carries
as `request` (the request log, `serving/_request_log.py`) at the top level. Prompts and
completions never reach a log record: nothing here has to filter them out.

A text line escapes the control characters (newlines, ANSI escapes, ...) of the values a
record's message is formatted with, as `\\n` or `\\x1b`: a value may come from a request
(a path, a model's name), and must not write a line of its own or drive a terminal. JSON
escapes them by itself. A value of the server's own that must keep its lines (a traceback's
frames) is marked `Verbatim`.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Mapping
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


class Verbatim(str):
    """A value logged as it is, its newlines kept: text of the server's own, never a
    request's."""


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, each value of the message escaped (`escape_controls`) unless
    `Verbatim`."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if args:
            record = copy.copy(record)  # the record is shared by every handler
            if isinstance(args, Mapping):
                record.args = {key: _escaped(value) for key, value in args.items()}
            else:
                record.args = tuple(_escaped(value) for value in args)
        return super().format(record)


_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def escape_controls(text: str) -> str:
    """`text` with its control characters and line separators written as escapes (`\\n`,
    `\\x1b`, `\\u2028`), so that it stays on its line and prints as what it is."""
    return text.translate(_CONTROLS)


def _escaped(value: object) -> object:
    if isinstance(value, str) and not isinstance(value, Verbatim):
        return escape_controls(value)
    return value


def configure_logging(level: str, log_format: str, *, name: str | None = None) -> None:
    """One handler (stderr), in text or JSON, at `level`: on the root logger (`mlx-nursery
    serve`, which owns the process), or on the logger `name` alone, not propagated (an app
    inside another's process, such as Hypercorn's CLI, whose own loggers keep their handlers
    and whose lines are then not written twice)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
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
