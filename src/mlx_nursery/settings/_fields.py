"""What each setting's field is made of: its help (`Help`, `described`), its default when
another package states it (`engine_default`, ...), its converters and validators.

A default the engine, the store or the generation front has too is read from the class
that states it, not restated here."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal

import attrs

from ..engine import EngineConfig
from ..generation import AudioLimits, ImageLimits, RequestCaps, parse_media_hosts
from ..store import StoreLimits

HELP = "mlx_nursery.help"
"""The metadata key of a field's `Help`."""
Unit = Literal["", "bytes", "seconds"]


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


@attrs.frozen
class Help:
    """A setting's help line and how its default reads (in --help and README's table)."""

    text: str
    none: str = "none"
    """What None means: the default's reading when it is None."""
    zero: str = ""
    """What 0 means, shown after the 0 when it is the default."""
    unit: Unit = ""
    """How a number reads: bytes as `8 MiB`, whole days of seconds as `30 days`."""


def described(text: str, *, none: str = "none", zero: str = "", unit: Unit = "") -> dict[str, Help]:
    return {HELP: Help(text, none, zero, unit)}


def engine_default(name: str) -> Any:
    """EngineConfig's default for `name`: stated once, in the engine."""
    return attrs.fields_dict(EngineConfig)[name].default


def image_default(name: str) -> Any:
    """ImageLimits' default for `name`: stated once, in the OpenAI layer."""
    return attrs.fields_dict(ImageLimits)[name].default


def audio_default(name: str) -> Any:
    """AudioLimits' default for `name`: stated once, in the OpenAI layer."""
    return attrs.fields_dict(AudioLimits)[name].default


def strings(value: str | typing.Iterable[str] | None) -> tuple[str, ...]:
    """A repeatable setting's values: one string (the environment's, comma-separated) or
    several (repeated flags); empty ones dropped."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(item.strip() for item in items if item.strip())


def keys(value: str | typing.Iterable[str] | None) -> tuple[str, ...]:
    """A key setting's values, as `strings`, but a blank one kept (as "") so that it is
    refused (`no_blank_key`) rather than dropped: `--api-key ""` would serve the API with
    no key."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(item.strip() for item in items)


def no_blank_key(
    _: object, attribute: attrs.Attribute[Any], value: str | tuple[str, ...] | None
) -> None:
    values = (value,) if isinstance(value, str) else value or ()
    if any(not item.strip() for item in values):
        raise SettingsError(
            f"{attribute.name} is empty: give a key (or leave the setting out to serve without one)"
        )


def store_default(name: str) -> Any:
    """StoreLimits' default for `name`: stated once, in the store."""
    return attrs.fields_dict(StoreLimits)[name].default


def caps_default(name: str) -> Any:
    """RequestCaps' default for `name`: stated once, in the OpenAI layer."""
    return attrs.fields_dict(RequestCaps)[name].default


def optional_positive(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value <= 0:
        raise SettingsError(f"{attribute.name} must be positive, got {value}")


def media_hosts(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    try:
        parse_media_hosts(value)
    except ValueError as exc:
        raise SettingsError(f"{attribute.name}: {exc}") from None


def one_of(*choices: int) -> Callable[[object, attrs.Attribute[Any], int | None], None]:
    """A validator: None or one of `choices`, refused with a message that lists them."""

    def validate(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
        if value is not None and value not in choices:
            listed = ", ".join(str(choice) for choice in choices)
            raise SettingsError(f"{attribute.name} must be one of {listed}, got {value}")

    return validate
