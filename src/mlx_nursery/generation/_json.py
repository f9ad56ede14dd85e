"""JSON from clients, parsed within limits: bounded depth, UTF-8, finite numbers, no lone
surrogates.

Python's `json` recurses once per nesting level, so a body nested ~1,000 deep raises
RecursionError, and the interpreter's recursion limit is no limit to rely on. The depth is
checked before parsing instead, in linear time: a body with few brackets is accepted after
two `bytes.count`s; otherwise numpy sums the brackets outside strings (faster than parsing
such a body). Numbers: `NaN` and `Infinity` are not JSON, a float literal beyond a double
(`1e999`) is refused rather than read as infinity, and an integer longer than Python's
4,300-digit conversion limit is a 400, not a ValueError.

A lone UTF-16 surrogate (`"\\ud800"`) parses to a Python string that cannot be encoded as
UTF-8: the tokenizer, SQLite and the stream's writer would each fail on it later. It is
refused once, right after parsing, naming where it is (`messages[0].content`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import fault_points
from ._errors import InvalidRequest, shortened

MAX_JSON_DEPTH = 128
"""Nesting levels (arrays and objects) a JSON document may have: far beyond any request's
own structure (5-6) and a deep JSON Schema's (each schema level adds two), far below what
would strain any recursive consumer after us (templates' `tojson`, llguidance)."""

TOO_DEEP = "json_too_deep"
"""The error code of a document nested beyond MAX_JSON_DEPTH."""

_OPEN_ARRAY, _CLOSE_ARRAY, _OPEN_OBJECT, _CLOSE_OBJECT, _QUOTE, _BACKSLASH = b'[]{}"\\'

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _NotJSON(ValueError):
    """A literal JSON does not allow (NaN, Infinity) or a number beyond a double."""


def parse_json(raw: bytes | str, *, param: str | None = None) -> Any:
    """Parse a client's JSON document within the limits above; InvalidRequest otherwise.

    `param` names the document in errors (None: the request body)."""
    fault_points.reach("parse")
    what = f"'{param}'" if param else "the request body"
    if isinstance(raw, str):
        data = raw.encode("utf-8", "surrogatepass")
    else:
        data = raw
        try:
            raw = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(
                f"{what} is not valid UTF-8", param=param, code="invalid_json"
            ) from None
    if depth_exceeds(data, MAX_JSON_DEPTH):
        raise InvalidRequest(
            f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels", param=param, code=TOO_DEEP
        )
    try:
        value = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotJSON as exc:
        raise InvalidRequest(
            f"{what} is not valid JSON: {exc}", param=param, code="invalid_json"
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"{what} is not valid JSON: {shortened(str(exc))}", param=param, code="invalid_json"
        ) from None
    except ValueError:  # int() past sys.get_int_max_str_digits()
        raise InvalidRequest(
            f"{what} holds an integer with too many digits", param=param, code="invalid_json"
        ) from None
    if _SURROGATE_ESCAPE.search(data):
        reject_lone_surrogates(value, param or "")
    return value


def depth_exceeds(data: bytes, limit: int) -> bool:
    """Whether the JSON text `data` nests arrays/objects deeper than `limit`. Linear time.

    For invalid JSON the answer may be too high, never too low for the part a parser reads
    before it finds the error."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    chars = np.frombuffer(data, np.uint8)
    brackets = np.flatnonzero(
        (chars == _OPEN_ARRAY)
        | (chars == _OPEN_OBJECT)
        | (chars == _CLOSE_ARRAY)
        | (chars == _CLOSE_OBJECT)
    )
    kinds = chars[brackets]
    steps = np.where((kinds == _OPEN_ARRAY) | (kinds == _OPEN_OBJECT), 1, -1).astype(np.int32)
    quotes = np.flatnonzero(chars == _QUOTE)
    quotes = quotes[~_escaped(chars, quotes)]
    # A bracket after an odd number of (unescaped) quotes is inside a string.
    steps[np.searchsorted(quotes, brackets) % 2 == 1] = 0
    return bool(np.cumsum(steps).max() > limit)


def _escaped(chars: npt.NDArray[np.uint8], quotes: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    """Which of the quotes at `quotes` follow an odd run of backslashes (escaped: `\\"`)."""
    escaped = np.zeros(quotes.size, bool)
    after_backslash = np.flatnonzero(chars[np.maximum(quotes - 1, 0)] == _BACKSLASH)
    if after_backslash.size:
        backslashes = np.flatnonzero(chars == _BACKSLASH)
        run_starts = backslashes[np.concatenate(([True], backslashes[1:] != backslashes[:-1] + 1))]
        candidates = quotes[after_backslash]
        starts = run_starts[np.searchsorted(run_starts, candidates - 1, side="right") - 1]
        escaped[after_backslash] = (candidates - starts) % 2 == 1
    return escaped


def _refuse_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJSON(f"the number {shortened(text, 40)} is beyond the range of a double")
    return value


def reject_lone_surrogates(value: Any, path: str = "") -> None:
    """Raise InvalidRequest naming the first string (or key) holding a lone UTF-16 surrogate."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, str):
            if _has_lone_surrogate(node):
                raise _surrogate_error(where, key=False)
        elif isinstance(node, dict):
            children = []
            for key, child in node.items():
                if _has_lone_surrogate(key):
                    raise _surrogate_error(where, key=True)
                children.append((child, f"{where}.{key}" if where else key))
            stack.extend(reversed(children))
        elif isinstance(node, list):
            stack.extend(reversed([(child, f"{where}[{i}]") for i, child in enumerate(node)]))


def _has_lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _surrogate_error(where: str, *, key: bool) -> InvalidRequest:
    place = f"a key of '{where}'" if key and where else "a key" if key else f"'{where or 'body'}'"
    return InvalidRequest(
        f"{place} holds a lone UTF-16 surrogate, which is not valid Unicode text",
        param=where or None,
        code="invalid_value",
    )
