"""The testing package's harness, as a server's `Extension` (the seam: `serving/_extensions.py`).

The entry points that serve users (`mlx-nursery serve`, `mlx_nursery.asgi`, `start_server`)
hand `harness(settings)` to the app; the rest of the server knows none of it. Its parts turn
on as the server needs them:

- the `script` field (`_scripts.py`) is taken off every generation request: a scripted model
  (known when it loads, from its files) runs it, with `--script` as the default; any other
  model answers a request that sends one with the 400 naming `script`;
- `--fault-rate` above 0 draws a fault for each generation request (`_fault_rate.py`);
- the wrapper that cuts a stream's connection (`_drops.py`) is always around the app: a
  scripted model's `drop_after` and `--fault drop_after:N` both cut, and which models are
  scripted is known only once they load.

`extra_processors` is a test's own extension: logits processors per request, which make a
real model emit a chosen token script through the real engine and streaming path. It is not
reachable over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..engine import LogitsProcessor
from ..generation import OpenAIError, Prepared, ServedModel, with_processors
from ..serving import Extension, PlanHook
from ..settings import Settings, SettingsError
from ._drops import ConnectionDrops
from ._fault_rate import FaultInjector, parse_fault
from ._script_schema import ScriptSpec
from ._scripts import ScriptedPlans, parse_field, parse_script, refuse_field

RequestProcessors = Callable[[Any], tuple[LogitsProcessor | None, ...]]
"""Extra logits processors for a request, given its JSON body."""


def harness(settings: Settings) -> Extension:
    """The harness of a server run with `settings`. Raises SettingsError for a `--fault` or
    a `--script` file that cannot be used. Reads the script's file: startup only."""
    default = default_script(settings)
    injector = FaultInjector(settings.fault_rate, parse_fault(settings.fault), settings.fault_seed)

    def for_model(served: ServedModel) -> PlanHook:
        return ScriptedPlans(served.tokenizer, default) if served.scripted else refuse_field

    return Extension(
        "harness",
        fields={"script": parse_field},
        for_model=for_model,
        on_request=injector.on_request if settings.fault_rate > 0 else None,
        wrap=ConnectionDrops,
    )


def extra_processors(processors: RequestProcessors) -> Extension:
    """An extension adding `processors(body)` to each generation request's logits
    processors (None entries are skipped)."""

    def add(plan: Prepared, fields: Mapping[str, object], body: Any) -> Prepared:
        return with_processors(plan, *processors(body))

    return Extension("extra_processors", for_model=lambda served: add)


def default_script(settings: Settings) -> ScriptSpec | None:
    """The script in `--script`'s file (None without one). Raises SettingsError for a file
    that cannot be read or is not a valid script. Reads a file: startup only."""
    if settings.script is None:
        return None
    path = Path(settings.script).expanduser()
    try:
        value = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise SettingsError(f"--script {path}: {exc}") from None
    try:
        return parse_script(value, "--script")
    except OpenAIError as exc:
        where = f" (at {exc.param})" if exc.param and exc.param not in exc.message else ""
        raise SettingsError(f"--script {path}: {exc.message}{where}") from None
