"""Testing clients against a real mlx-nursery server: a server on its own thread
(`start_server`, `LiveServer`) and what it saw (`ServerReport`); the pytest plugin of these
is `mlx_nursery.testing.plugin`. And the harness the server's entry points register with
it (`harness`: the scripted model's `script` field, `--fault-rate`, connection drops), through
the one seam the server has for it (`mlx_nursery.serving.Extension`).

The names load on first use (PEP 562): the plugin imports this package at every pytest
start, and a test run that never uses the server must not pay for Trio, the server or MLX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._faults import injected_fault
    from ._harness import extra_processors, harness
    from ._live import LiveServer, start_server
    from ._report import CancelCause, ServerReport

__all__ = [
    "CancelCause",
    "LiveServer",
    "ServerReport",
    "extra_processors",
    "harness",
    "injected_fault",
    "start_server",
]

_HOMES = {
    "injected_fault": "_faults",
    "extra_processors": "_harness",
    "harness": "_harness",
    "CancelCause": "_report",
    "ServerReport": "_report",
    "LiveServer": "_live",
    "start_server": "_live",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
