"""Structuring errors as the client reads them: cattrs' exception groups become one
`InvalidRequest` naming the parameter's wire path (`messages[2].content`), and JSON kinds are
named as JSON names them ("an object", not "dict").

The converter's hooks raise; this module only words what they raised (`translated`).
"""

from __future__ import annotations

import typing
from typing import Any

import attrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from ._errors import InvalidRequest, shortened

KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}
"""The JSON kinds the converter checks strictly, named for error messages."""

STRUCTURING_ERRORS = (
    ClassValidationError,
    IterableValidationError,
    InvalidRequest,
    TypeError,
    ValueError,
    KeyError,
)
"""What the converter's hooks raise for a value that does not fit (cattrs groups the rest)."""

_HAND_CHECKED = ("input[", "tools[", "text.", "tool_choice", "response_format")
"""Paths whose wrong values are `invalid_value`, the code they had when these fields were
checked by hand, before they were typed. Other fields' wrong types carry no code, as always."""


def json_name(value: Any) -> str:
    """The JSON kind of a parsed value, as an error names it."""
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def describe(tp: Any) -> str:
    """What a type accepts, as an error names it ("an array", "'auto' or 'none'")."""
    origin = typing.get_origin(tp) or tp
    if tp is type(None):
        return "null"
    if origin in (list, tuple):
        return "an array"
    if origin is dict or attrs.has(origin):
        return "an object"
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    return KIND_NAMES.get(origin, str(origin))


def translated(exc: BaseException, path: str = "") -> InvalidRequest:
    """The 400 for a structuring error: its first leaf, named by its path below `path`."""
    found, leaf = _first_error(exc, path)
    return _translate(found, leaf)


def _translate(path: str, leaf: BaseException) -> InvalidRequest:
    if isinstance(leaf, InvalidRequest):
        if path and leaf.param:
            leaf.param = (
                f"{path}.{leaf.param}" if not leaf.param.startswith("[") else path + leaf.param
            )
        elif path:
            leaf.param = path
        return leaf
    if isinstance(leaf, ForbiddenExtraKeysError):
        extra = shortened(min(leaf.extra_fields))
        name = f"{path}.{extra}" if path else extra
        return InvalidRequest(
            f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter"
        )
    if isinstance(leaf, KeyError):
        name = path or str(leaf.args[0])  # cattrs' note already named the missing attribute
        return InvalidRequest(
            f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
        )
    code = "invalid_value" if path.startswith(_HAND_CHECKED) else None
    return InvalidRequest(
        f"Invalid value for '{path or 'body'}': {leaf}", param=path or None, code=code
    )


def _first_error(exc: BaseException, path: str) -> tuple[str, BaseException]:
    """Walk cattrs' exception groups down to the first leaf, building a `a.b[0].c` path."""
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        with_notes, _ = exc.group_exceptions()
        if with_notes:
            inner, note = with_notes[0]
            name = getattr(note, "name", None)
            index = getattr(note, "index", None)
            if name is not None:
                step = f"{path}.{name}" if path else name
            elif index is not None:
                step = f"{path}[{index}]"
            else:
                step = path
            return _first_error(inner, step)
        inner = exc.exceptions[0]
        return _first_error(inner, path)
    if isinstance(exc, BaseExceptionGroup):
        return _first_error(exc.exceptions[0], path)
    return path, exc
