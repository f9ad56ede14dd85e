"""Sizes and durations as operators write them: `2GiB`, `1 GB`, `512MiB`, `90s`, `1m`,
`30 days`; a bare number is bytes, or seconds.

`--help` and README print defaults in these units (`2 GiB`, `30 days`), so whatever they
print is accepted back, by a flag and an environment variable alike (settings/). Decimal
units are powers of 1000 (`GB`), binary ones of 1024 (`GiB`), as the IEC names them; a bare
`G` or `M` is refused rather than guessed, and `m` is a minute.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

BYTE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
SECOND_UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}


def parse_bytes(text: str) -> int:
    """`text` as a number of bytes: `8388608`, `512MiB`, `2 GiB`, `1GB`, `1.5GiB` (rounded
    down to a whole byte). Raises ValueError saying what is accepted."""
    number, unit = _split(text, "a size")
    scale = BYTE_UNITS.get(unit.lower(), 0) if unit else 1
    if not scale:
        raise ValueError(f"unknown size unit {unit!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    return int(number * scale)


def parse_seconds(text: str) -> float:
    """`text` as seconds: `600`, `90s`, `1m`, `1.5h`, `30 days`, `250ms`. Raises ValueError
    saying what is accepted."""
    number, unit = _split(text, "a duration")
    scale = SECOND_UNITS.get(unit.lower()) if unit else 1.0
    if scale is None:
        raise ValueError(f"unknown time unit {unit!r} (use ms, s, m, h or d)")
    return number * scale


def _split(text: str, what: str) -> tuple[float, str]:
    match = _NUMBER.match(text)
    if match is None:
        raise ValueError(f"not {what} (a number and an optional unit)")
    number = float(match.group(1))
    if not math.isfinite(number):
        raise ValueError(f"not {what} (a finite number)")
    return number, match.group(2)
