"""The HTTP package's public surface: what app.py, server.py and cli.py are built from, and
only that."""

from __future__ import annotations

import ast
from pathlib import Path

import mlx_nursery
from mlx_nursery import http

SOURCE = Path(mlx_nursery.__file__).parent


def test_all_names_exist_once() -> None:
    assert len(set(http.__all__)) == len(http.__all__)
    for name in http.__all__:
        assert hasattr(http, name), name


def test_app_and_server_import_http_only_through_its_package() -> None:
    imported: set[str] = set()
    # ...and the test harness's connection drops (testing/_drops.py), the one user outside.
    for module in ("app.py", "server.py", "cli.py", "testing/_drops.py"):
        tree = ast.parse((SOURCE / module).read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("http"):
                assert node.module == "http", f"{module} imports from {node.module}"
                imported.update(alias.name for alias in node.names)
    assert imported == set(http.__all__)
