"""How a setting reads: its flag and environment variable names, its value's type, its
value parsed from text (sizes and durations with units), its default as --help shows it."""

from __future__ import annotations

import functools
import typing
from typing import Any

import attrs

from .._units import parse_bytes, parse_seconds
from ._fields import HELP, Help, SettingsError, Unit

ENV_PREFIX = "MLX_NURSERY_"
_DAY = 24 * 3600


@functools.cache
def _field_types() -> dict[str, Any]:
    """Each setting's declared type. Imported here, not at the top: `Settings` reads its
    values with this module's `parse`."""
    from ._settings import Settings

    return typing.get_type_hints(Settings)


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def flag_name(field: attrs.Attribute[Any]) -> str:
    """The command-line flag of a setting: `max_queue` -> `--max-queue`."""
    return "--" + field.name.replace("_", "-")


def setting_help(field: attrs.Attribute[Any]) -> Help:
    """A setting's help line and how its default reads, from its metadata."""
    help_: Help = field.metadata[HELP]
    return help_


def value_type(field: attrs.Attribute[Any]) -> type:
    """The type a setting's value is parsed as: `int | None` -> int."""
    kind = _field_types()[field.name]
    args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    scalar: type = args[0] if args else kind
    return scalar


def repeatable(field: attrs.Attribute[Any]) -> bool:
    """Whether a setting takes several values (`tuple[str, ...]`: a flag given repeatedly)."""
    return typing.get_origin(_field_types()[field.name]) is tuple


def shown_default(field: attrs.Attribute[Any]) -> str:
    """How a setting's default reads in --help and README: `2 GiB`, `30 days`, `0 (by load)`."""
    help_ = setting_help(field)
    value = field.default
    if value is None or value == ():
        return help_.none
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == 0 and help_.zero:
        return f"0 ({help_.zero})"
    if help_.unit == "bytes":
        return _bytes(value)
    if help_.unit == "seconds" and value >= _DAY and value % _DAY == 0:
        return f"{value / _DAY:g} days"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bytes(value: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift} {unit}"
    return str(value)


def takes_units(field: attrs.Attribute[Any]) -> bool:
    """Whether a setting is a size or a duration, written with units (`2GiB`, `90s`)."""
    return setting_help(field).unit != ""


def parse(field: attrs.Attribute[Any], raw: str, where: str) -> Any:
    """A setting's value from its text in a flag or an environment variable (`where` names
    it in the error). Raises SettingsError."""
    kind = value_type(field)
    if kind is bool:
        if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise SettingsError(f"{where}={raw!r} is not a boolean (true or false)")
        return raw.lower() in ("1", "true", "yes", "on")
    if kind in (int, float) and raw.strip().lower() in ("none", "off") and _optional(field):
        return None
    unit = setting_help(field).unit
    try:
        if unit == "bytes":
            return parse_bytes(raw)
        if unit == "seconds":
            return parse_seconds(raw)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError as exc:
        detail = f": {exc}" if unit else ""
        raise SettingsError(f"{where}={raw!r} is not a {_NOUNS[unit]}{detail}") from None
    return raw


def _optional(field: attrs.Attribute[Any]) -> bool:
    return type(None) in typing.get_args(_field_types()[field.name])


_NOUNS: dict[Unit, str] = {"": "number", "bytes": "size", "seconds": "duration"}
