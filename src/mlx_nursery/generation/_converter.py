"""One cattrs converter for the wire schemas of every API, strict about JSON types.

cattrs by default coerces (`int("5")`, `str(5)`); an API must not: a wrong
type is a 400 naming the parameter. Unions are resolved by the JSON kind of
the value (string, number, list, object), which is how OpenAI's schemas are
written; unions of objects by their `type` (tagged unions: `_TAGGED`). Integers are 64-bit,
as OpenAI's schemas declare them (int64): a larger one is a 400 naming its field, never a
value that breaks something later. Structuring errors become `InvalidRequest` with the
parameter's path (`_structuring_errors`). The wire packages register their own tagged unions,
lenient classes and unstructure hooks here when their schema modules are imported.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.cols import list_structure_factory, mapping_structure_factory
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from . import _request_parts as parts
from ._errors import InvalidRequest, quoted
from ._structuring_errors import KIND_NAMES, STRUCTURING_ERRORS, describe, json_name, translated

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True, omit_if_default=False)

_JSON_KIND: dict[type, tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (int, float),
    bool: (bool,),
}
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _strict(kind: type) -> Callable[[Any, Any], Any]:
    accepted = _JSON_KIND[kind]

    def structure(value: Any, _: Any) -> Any:
        # bool is an int subclass in Python, never in JSON.
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, accepted):
            raise TypeError(f"expected {KIND_NAMES[kind]}, got {json_name(value)}")
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


# -- containers: a JSON array or object, never any iterable -----------------------------------
def _is_list(tp: Any) -> bool:
    return typing.get_origin(tp) is list


def _list_hook(tp: Any) -> Callable[[Any, Any], Any]:
    inner = list_structure_factory(tp, converter)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, list):  # a string would be structured character by character
            raise TypeError(f"expected an array, got {json_name(value)}")
        return inner(value, tp)

    return structure


converter.register_structure_hook_factory(_is_list, _list_hook)


def _is_dict(tp: Any) -> bool:
    return typing.get_origin(tp) is dict or tp is dict


def _dict_hook(tp: Any) -> Callable[[Any, Any], Any]:
    inner = mapping_structure_factory(tp, converter)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {json_name(value)}")
        return inner(value, tp)

    return structure


converter.register_structure_hook_factory(_is_dict, _dict_hook)


# -- tagged unions on `type` ------------------------------------------------------------------
@attrs.frozen
class Tagged:
    """Objects told apart by their `type`; an unknown one is a 400 with `code`."""

    by_tag: Mapping[str, type]
    message: str
    """The error for an unknown `type`, quoted in place of `{tag}`."""
    code: str = "unsupported_parameter"
    param: str | None = "type"
    """What the error names, below the object (None: the object itself)."""
    default: type | None = None
    """The member a missing `type` means (None: a missing `type` is unknown)."""

    def pick(self, value: dict[str, Any]) -> type:
        if "type" not in value and self.default is not None:
            return self.default
        tag = value.get("type")
        if isinstance(tag, str) and tag in self.by_tag:
            return self.by_tag[tag]
        raise InvalidRequest(self.message.format(tag=quoted(tag)), param=self.param, code=self.code)


_TAGGED: dict[frozenset[type], Tagged] = {
    frozenset({parts.FunctionTool}): Tagged(
        {"function": parts.FunctionTool},
        "tool type {tag} is not supported; only 'function' tools are",
    ),
    frozenset({parts.NamedToolChoice}): Tagged(
        {"function": parts.NamedToolChoice},
        "invalid tool_choice type {tag}",
        code="invalid_value",
        param=None,
    ),
    frozenset({parts.NamedToolChoice, parts.ToolChoiceType}): Tagged(
        {
            "function": parts.NamedToolChoice,
            "none": parts.ToolChoiceType,
            "auto": parts.ToolChoiceType,
        },
        "invalid tool_choice type {tag}",
        code="invalid_value",
        param=None,
    ),
    frozenset(parts.ResponseFormat.__args__): Tagged(
        {
            "text": parts.TextFormat,
            "json_object": parts.JsonObjectFormat,
            "json_schema": parts.JsonSchemaFormat,
        },
        "response_format type {tag} is not supported",
    ),
    frozenset(parts.TextFormatParam.__args__): Tagged(
        {
            "text": parts.TextFormat,
            "json_object": parts.JsonObjectFormat,
            "json_schema": parts.TextJsonSchemaFormat,
        },
        "text.format type {tag} is not supported",
    ),
}
_TAG_OF = {
    cls: tagged for members, tagged in _TAGGED.items() if len(members) == 1 for cls in members
}


def register_tagged_union(members: Iterable[type], tagged: Tagged) -> None:
    """Another API's objects told apart by `type` (the Messages API's content blocks, tools,
    tool_choice), structured by this one converter as its own are. Call it when the API's
    schema module is imported, before anything of it is structured: cattrs builds a class's
    hook on first use."""
    key = frozenset(members)
    _TAGGED[key] = tagged
    if len(key) == 1:
        _TAG_OF.update(dict.fromkeys(key, tagged))


_LENIENT: set[type] = set()
"""Classes whose unknown fields are ignored rather than refused (`register_lenient`)."""


def register_lenient(classes: Iterable[type]) -> None:
    """Classes whose unknown fields are ignored rather than refused: the Responses API's input
    items and their parts, which clients replay from the output items they received (`status`,
    `annotations`, ...). Call it when the schema module is imported, as `register_tagged_union`."""
    _LENIENT.update(classes)


def _attrs_hook(cls: type) -> Callable[[Any, Any], Any]:
    """Generated by cattrs, after checking for an object (and its `type`, if it is tagged)."""
    generated: Callable[[Any, Any], Any] = make_dict_structure_fn(
        cls, converter, _cattrs_forbid_extra_keys=cls not in _LENIENT
    )
    tagged = _TAG_OF.get(cls)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {json_name(value)}")
        if tagged is not None:
            tagged.pick(value)
        return generated(value, cls)

    return structure


converter.register_structure_hook_factory(attrs.has, _attrs_hook)


# -- unions and literals ----------------------------------------------------------------------
def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _matches(tp: Any, value: Any) -> bool:
    origin = typing.get_origin(tp) or tp
    if tp is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if _is_union(tp):
        return any(_matches(member, value) for member in typing.get_args(tp))
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
    members = typing.get_args(tp)
    objects = frozenset(m for m in members if attrs.has(m))
    if isinstance(value, dict) and len(objects) > 1 and objects in _TAGGED:
        return converter.structure(value, _TAGGED[objects].pick(value))
    for member in members:
        if _matches(member, value):
            return None if value is None else converter.structure(value, member)
    lists = [m for m in members if typing.get_origin(m) is list]
    if isinstance(value, list) and len(lists) == 1:  # the one array: name the element that is wrong
        return converter.structure(value, lists[0])
    expected = " or ".join(dict.fromkeys(describe(m) for m in members))
    raise TypeError(f"expected {expected}, got {json_name(value)}")


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


# -- unstructuring: the wire packages register what they leave out ----------------------------
def register_unstructure_hook(cls: type[T], hook: Callable[[T], Any]) -> None:
    """How `to_json` writes `cls` (a wire package's rule: fields left out rather than null)."""
    converter.register_unstructure_hook(cls, hook)


def unstructure_fields(cls: type[T]) -> Callable[[T], dict[str, Any]]:
    """`cls`'s fields as `to_json` writes them by default (the hooks registered so far apply),
    for a hook that edits the result."""
    return make_dict_unstructure_fn(cls, converter)


def to_json(value: Any) -> Any:
    """A wire object as JSON-ready data."""
    return converter.unstructure(value)


def structure(data: Any, cls: type[T], path: str = "") -> T:
    """Structure a parsed JSON body into `cls`, or raise InvalidRequest naming the parameter
    (`path` names where `data` is, for a value structured on its own). A top-level null for
    a field that has a default is that default (clients that send every field send the unset
    ones as null), where the field's type has no null of its own."""
    if not isinstance(data, dict) and not path:
        raise InvalidRequest(f"the request body must be a JSON object, got {json_name(data)}")
    if isinstance(data, dict) and attrs.has(cls):
        defaulted = _null_means_default(cls)
        data = {k: v for k, v in data.items() if v is not None or k not in defaulted}
    try:
        return converter.structure(data, cls)
    except STRUCTURING_ERRORS as exc:
        raise translated(exc, path) from None


@functools.cache
def _null_means_default(cls: type) -> frozenset[str]:
    """`cls`'s fields with a default whose type does not take None."""
    hints = typing.get_type_hints(cls)
    return frozenset(
        field.name
        for field in attrs.fields(cls)
        if field.default is not attrs.NOTHING and not _takes_none(hints.get(field.name, Any))
    )


def _takes_none(tp: Any) -> bool:
    if tp is Any or tp is None or tp is type(None):
        return True
    return any(_takes_none(arg) for arg in typing.get_args(tp)) if _is_union(tp) else False
