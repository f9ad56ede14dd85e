"""One cattrs converter for the wire schemas, strict about JSON types.

cattrs by default coerces (`int("5")`, `str(5)`); an API must not: a wrong
type is a 400 naming the parameter. Unions are resolved by the JSON kind of
the value (string, number, list, object), which is how OpenAI's schemas are
written. Integers are 64-bit, as OpenAI's schemas declare them (int64): a larger one is a
400 naming its field, never a value that breaks something later. Structuring errors become
`InvalidRequest` with the parameter's path.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.v import format_exception

from ._errors import InvalidRequest, quoted, shortened

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True, omit_if_default=False)

_JSON_KIND: dict[type, tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (int, float),
    bool: (bool,),
}
_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _strict(kind: type) -> Callable[[Any, Any], Any]:
    accepted = _JSON_KIND[kind]

    def structure(value: Any, _: Any) -> Any:
        # bool is an int subclass in Python, never in JSON.
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, accepted):
            raise TypeError(f"expected {_KIND_NAMES[kind]}, got {_json_name(value)}")
        if isinstance(value, int) and not isinstance(value, bool):
            if kind is int and not INT64_MIN <= value <= INT64_MAX:
                raise ValueError("expected a 64-bit integer (from -2^63 to 2^63-1)")
            if kind is float:
                try:
                    return float(value)
                except OverflowError:  # an integer beyond a double's range
                    raise ValueError("the number is too large") from None
        return value

    return structure


for _kind in _JSON_KIND:
    converter.register_structure_hook(_kind, _strict(_kind))


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _matches(tp: Any, value: Any) -> bool:
    origin = typing.get_origin(tp) or tp
    if tp is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if origin in (list, tuple):
        if not isinstance(value, list):
            return False
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return all(_matches(item, element) for element in value)
    if origin is dict or attrs.has(origin):
        return isinstance(value, dict)
    if origin in _JSON_KIND:
        return isinstance(value, _JSON_KIND[origin]) and not (
            isinstance(value, bool) and origin is not bool
        )
    return origin is Any


def _structure_union(value: Any, tp: Any) -> Any:
    for member in typing.get_args(tp):
        if _matches(member, value):
            return None if value is None else converter.structure(value, member)
    expected = " or ".join(_describe(m) for m in typing.get_args(tp))
    raise TypeError(f"expected {expected}, got {_json_name(value)}")


converter.register_structure_hook_func(_is_union, _structure_union)


def _structure_literal(value: Any, tp: Any) -> Any:
    allowed = typing.get_args(tp)
    if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
        raise ValueError(
            f"expected one of {', '.join(repr(a) for a in allowed)}, got {quoted(value)}"
        )
    return value


converter.register_structure_hook_func(
    lambda tp: getattr(tp, "__origin__", None) is typing.Literal, _structure_literal
)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp) or tp
    if tp is type(None):
        return "null"
    if origin in (list, tuple):
        return "an array"
    if origin is dict or attrs.has(origin):
        return "an object"
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    return _KIND_NAMES.get(origin, str(origin))


def _json_name(value: Any) -> str:
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


def structure(data: Any, cls: type[T]) -> T:
    """Structure a parsed JSON body into `cls`, or raise InvalidRequest naming the parameter."""
    if not isinstance(data, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {_json_name(data)}")
    try:
        return converter.structure(data, cls)
    except InvalidRequest:
        raise
    except Exception as exc:  # noqa: BLE001 - every structuring failure is the client's
        path, leaf = _first_error(exc, "")
        raise _as_invalid(path, leaf) from None


def _as_invalid(path: str, leaf: BaseException) -> InvalidRequest:
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
    message = (
        str(leaf) if isinstance(leaf, (TypeError, ValueError)) else format_exception(leaf, None)
    )
    return InvalidRequest(f"Invalid value for '{path or 'body'}': {message}", param=path or None)


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
