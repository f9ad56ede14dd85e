"""The direction of the package's layers: each package and top-level module of mlx_nursery
imports only those of ours its row in ALLOWED names, so data flows down (HTTP -> serving ->
wire layers -> generation -> engine -> models -> tools) and nothing imports upward.

Rows for packages that do not exist yet (the house plan's) are skipped until they do; a
unit that exists without a row fails, so a new package is placed in the table on arrival.
Imports inside functions and under TYPE_CHECKING count: a lazy upward import is still one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.house.test_house_rules import SRC, imported_modules, package_of

LEAVES = frozenset({"_cuda_graphs", "_units", "fault_points", "logs"})
"""Shared leaves: anything may import them; they import none of ours."""
_RUNTIME = frozenset({"engine", "models", "store", "tools"})
_WIRE = frozenset({"anthropic", "generation", "openai"})
_BELOW_HTTP = LEAVES | _RUNTIME | _WIRE | {"distributed", "serving", "settings"}

ALLOWED: dict[str, frozenset[str]] = {
    "_cuda_graphs": frozenset(),  # MLX's switch defaulted as the package is imported
    "_units": frozenset(),
    "fault_points": frozenset(),
    "logs": frozenset(),
    "tools": LEAVES,
    "models": LEAVES | {"tools"},
    "engine": LEAVES | {"models"},
    "store": LEAVES,
    "generation": LEAVES | {"engine", "models", "store"},
    "openai": LEAVES | {"generation", "engine", "models", "store"},
    # The two wire layers side by side: what both need is in generation.
    "anthropic": LEAVES | {"generation", "engine", "models", "store"},
    # Not a leaf yet: its defaults and limits records come from the packages they configure.
    "settings": LEAVES | {"engine", "generation", "models", "openai", "store"},
    # One model across devices: the engine's batch mirrored (below the serving core, which
    # opens a model's engine as rank 0 of a group).
    "distributed": LEAVES | {"engine", "models", "settings"},
    "serving": LEAVES | _RUNTIME | _WIRE | {"distributed", "settings"},
    "http": _BELOW_HTTP,
    "app": _BELOW_HTTP | {"http"},
    "server": _BELOW_HTTP | {"app", "http"},
    "asgi": _BELOW_HTTP | {"app", "http", "server", "testing"},
    # The harness (the scripted model's field, --fault-rate, connection drops) is the
    # testing package's: the entry points hand it to the app (HARNESS_ENTRY_POINTS).
    "testing": _BELOW_HTTP | {"app", "http", "server"},
    "cli": _BELOW_HTTP | {"app", "http", "server", "testing"},
    "__main__": frozenset({"cli"}),
}
"""Each unit (a package, or a top-level module of mlx_nursery) -> the units of ours it imports."""

HARNESS_ENTRY_POINTS = frozenset({"cli", "asgi"})
"""The units outside the testing package that import it: the entry points that serve users,
which hand its harness to the app. They import its public `harness` and nothing else of it."""
HARNESS_NAMES = frozenset({"mlx_nursery.testing", "mlx_nursery.testing.harness"})

FORBIDDEN_THIRD_PARTY: dict[str, frozenset[str]] = {
    unit: frozenset({"quart", "quart_trio", "hypercorn", "werkzeug"})
    for unit in (
        "tools",
        "models",
        "engine",
        "store",
        "generation",
        "openai",
        "anthropic",
        "serving",
    )
}
"""The web framework stays in http/ and the composition root (app, server)."""


def unit_of(path: Path) -> str:
    """The unit a source file belongs to: its top-level package, or its module's name."""
    parts = path.relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def existing_units() -> set[str]:
    return {unit_of(path) for path in SRC.rglob("*.py") if unit_of(path) != "__init__"}


def upward_imports(source: str, package: str, unit: str) -> list[tuple[int, str]]:
    """What `source` (a module of `package`, in `unit`) imports that its row does not allow:
    units of ours outside ALLOWED[unit], and the web framework where it is forbidden."""
    allowed = ALLOWED[unit] | {unit}
    forbidden = FORBIDDEN_THIRD_PARTY.get(unit, frozenset())
    offences = []
    for line, target in imported_modules(source, package):
        parts = target.split(".")
        if parts[0] == "mlx_nursery":
            if len(parts) > 1 and parts[1] not in allowed:
                offences.append((line, target))
        elif parts[0] in forbidden:
            offences.append((line, target))
    return offences


def test_every_unit_has_a_row() -> None:
    assert sorted(existing_units() - ALLOWED.keys()) == []


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_no_unit_imports_upward(unit: str) -> None:
    if unit not in existing_units():
        pytest.skip(f"{unit} does not exist yet")
    offences = [
        f"{path.relative_to(SRC)}:{line} imports {target}"
        for path in sorted(SRC.rglob("*.py"))
        if unit_of(path) == unit
        for line, target in upward_imports(path.read_text(), package_of(path), unit)
    ]
    assert offences == []


@pytest.mark.parametrize(
    "source, package, unit, offending",
    [
        ("from ..http import routes", "mlx_nursery.engine", "engine", True),
        ("from ..models import load_model", "mlx_nursery.engine", "engine", False),
        ("from ..engine import Engine", "mlx_nursery.models", "models", True),
        ("from ..tools import make_model", "mlx_nursery.models", "models", False),
        ("from ..models import load_model", "mlx_nursery.tools", "tools", True),
        ("from ..openai import Prepared", "mlx_nursery.store", "store", True),
        ("from ..serving import Jobs", "mlx_nursery.generation", "generation", True),
        ("from ..openai import parse_json", "mlx_nursery.generation", "generation", True),
        ("from ..http import routes", "mlx_nursery.openai", "openai", True),
        ("from ..generation import Prepared", "mlx_nursery.openai", "openai", False),
        ("import mlx_nursery.serving._jobs", "mlx_nursery.anthropic", "anthropic", True),
        ("from ..openai import prepare_chat", "mlx_nursery.anthropic", "anthropic", True),
        ("from ..generation import WireTraits", "mlx_nursery.anthropic", "anthropic", False),
        ("from ..testing import harness", "mlx_nursery.serving", "serving", True),
        ("from .testing import harness", "mlx_nursery", "app", True),
        ("from .testing import harness", "mlx_nursery", "cli", False),
        ("from quart import request", "mlx_nursery.serving", "serving", True),
        ("from ..http import tenant_of", "mlx_nursery.serving", "serving", True),
        ("from ..serving import Jobs", "mlx_nursery.http", "http", False),
        ("from .. import cli", "mlx_nursery.testing", "testing", True),
        ("from . import fault_points", "mlx_nursery", "settings", False),
        ("from ._jobs import Jobs", "mlx_nursery.serving", "serving", False),
    ],
)
def test_the_rule_tells_downward_from_upward(
    source: str, package: str, unit: str, offending: bool
) -> None:
    assert bool(upward_imports(source, package, unit)) == offending


def test_the_table_has_no_cycle() -> None:
    """Two units allowed to import each other would be one layer in two names."""
    seen: dict[str, int] = {}

    def depth(unit: str, path: tuple[str, ...]) -> int:
        assert unit not in path, " -> ".join([*path, unit])
        if unit not in seen:
            seen[unit] = 1 + max((depth(u, (*path, unit)) for u in ALLOWED[unit]), default=0)
        return seen[unit]

    for unit in ALLOWED:
        depth(unit, ())


def harness_imports(source: str, package: str, unit: str) -> list[tuple[int, str]]:
    """What `source` imports of the testing package (its harness: the scripted model's wire
    field, the fault-rate hook, the connection-drop wrapper) that its unit may not: anything,
    outside the testing package and the entry points; more than `harness`, in those."""
    if unit == "testing":
        return []
    return [
        (line, target)
        for line, target in imported_modules(source, package)
        if target.split(".")[:2] == ["mlx_nursery", "testing"]
        and (unit not in HARNESS_ENTRY_POINTS or target not in HARNESS_NAMES)
    ]


def test_the_server_knows_the_harness_only_through_the_seam() -> None:
    """The serving core, the wire layers, HTTP and the composition root import nothing of
    the harness: they consult `serving.Extension` (serving/_extensions.py), which the entry
    points fill with `mlx_nursery.testing.harness`."""
    offences = [
        f"{path.relative_to(SRC)}:{line} imports {target}"
        for path in sorted(SRC.rglob("*.py"))
        for line, target in harness_imports(path.read_text(), package_of(path), unit_of(path))
    ]
    assert offences == []


@pytest.mark.parametrize(
    "source, package, unit, offending",
    [
        ("from .testing import harness", "mlx_nursery", "cli", False),
        ("from .testing._scripts import parse_field", "mlx_nursery", "cli", True),
        ("from .testing import start_server", "mlx_nursery", "asgi", True),
        ("from .testing import harness", "mlx_nursery", "app", True),
        ("from ..testing._drops import ConnectionDrops", "mlx_nursery.http", "http", True),
        ("from ._fault_rate import parse_fault", "mlx_nursery.testing", "testing", False),
    ],
)
def test_the_harness_rule_tells_entry_points_from_the_rest(
    source: str, package: str, unit: str, offending: bool
) -> None:
    assert bool(harness_imports(source, package, unit)) == offending
