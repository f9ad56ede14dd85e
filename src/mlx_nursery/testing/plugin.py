"""The pytest plugin (entry point `pytest11: mlx_nursery`): a real server for client tests.

Fixtures (nothing runs until a test asks for one):

- `mlx_server`: a `LiveServer` for one test, on a free port, with the scripted model unless
  the test's `@pytest.mark.mlx_server(model=..., **settings)` or an override of the
  `mlx_server_settings` fixture says otherwise.
- `mlx_session_server`: one `LiveServer` for the whole session (configured by overriding
  `mlx_session_server_settings`); its counters add up across tests.

This module imports only pytest at collection: the server, Trio, openai and MLX load when a
test first uses a fixture, so a test run that does not use them pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ._live import LiveServer

MARKER = "mlx_server"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(model='scripted', **settings): the model and server settings of the "
        "test's `mlx_server` fixture (mlx_nursery.testing.start_server's arguments)",
    )


@pytest.fixture
def mlx_server_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """`start_server`'s arguments for `mlx_server`: the test's `mlx_server` marker's
    (`model` positional or keyword), else none (the scripted model). Override it in a
    conftest to change a suite's default."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return {}
    arguments = dict(marker.kwargs)
    if marker.args:
        (arguments["model"],) = marker.args
    return arguments


@pytest.fixture
def mlx_server(mlx_server_settings: dict[str, Any]) -> Iterator[LiveServer]:
    """A server for this test (`LiveServer`): started before it on its own thread, shut
    down and joined after it, whatever the test's event loop (none, Trio, asyncio)."""
    from ._live import start_server

    with start_server(**mlx_server_settings) as server:
        yield server


@pytest.fixture(scope="session")
def mlx_session_server_settings() -> dict[str, Any]:
    """`start_server`'s arguments for `mlx_session_server`; override it (session scope) in
    a conftest to serve another model or change settings."""
    return {}


@pytest.fixture(scope="session")
def mlx_session_server(mlx_session_server_settings: dict[str, Any]) -> Iterator[LiveServer]:
    """One server for the session: cheaper for many tests, but its counters are the sum
    of them all (compare a `report()` taken before with one after)."""
    from ._live import start_server

    with start_server(**mlx_session_server_settings) as server:
        yield server
