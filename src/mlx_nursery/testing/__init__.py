"""Testing clients against a real mlx-nursery server: a server on its own thread
(`start_server`, `LiveServer`) and what it saw (`ServerReport`); the pytest plugin of these
is `mlx_nursery.testing.plugin`.

The names load on first use (PEP 562): the plugin imports this package at every pytest
start, and a test run that never uses the server must not pay for Trio, the server or MLX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._faults import injected_fault
    from ._live import LiveServer, start_server
    from ._report import CancelCause, ServerReport

__all__ = ["CancelCause", "LiveServer", "ServerReport", "injected_fault", "start_server"]


def __getattr__(name: str) -> Any:
    if name == "injected_fault":
        from . import _faults

        return _faults.injected_fault
    if name in ("CancelCause", "ServerReport"):
        from . import _report

        return getattr(_report, name)
    if name in __all__:
        from . import _live

        return getattr(_live, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
