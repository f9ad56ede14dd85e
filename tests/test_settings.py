"""Settings are the one place defaults are stated: the CLI and README's table must agree.

A default changed in settings.py alone fails the README check; one restated in README alone
fails it too; the CLI has no defaults of its own to drift (a flag not given is None).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from mlx_nursery.cli import build_parser, serve_settings
from mlx_nursery.engine import EngineConfig
from mlx_nursery.settings import (
    Settings,
    SettingsError,
    flag_name,
    setting_help,
    shown_default,
)

README = Path(__file__).resolve().parents[1] / "README.md"
FIELDS = attrs.fields(Settings)


def _readme_options() -> dict[str, str]:
    """flag -> default, from the table under README's "### Serving options"."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Serving options", 1)[1].split("\n### ", 1)[0]
    options: dict[str, str] = {}
    for line in section.splitlines():
        if not line.startswith("| `--"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        flags = re.findall(r"`(--[a-z-]+)`", cells[0])
        defaults = [d.strip().replace("`", "") for d in cells[1].split(", ")]
        assert len(flags) == len(defaults), f"README row {cells[0]!r}: one default per flag"
        options.update(zip(flags, defaults, strict=True))
    return options


def _serve_actions() -> dict[str, argparse.Action]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = subparsers.choices["serve"]
    return {a.option_strings[0]: a for a in serve._actions if a.option_strings[0] != "-h"}


def test_readme_table_lists_every_flag_with_its_default() -> None:
    expected = {flag_name(field): shown_default(field) for field in FIELDS}
    assert _readme_options() == expected


def test_cli_has_a_flag_per_setting_with_the_settings_help_and_default() -> None:
    actions = _serve_actions()
    assert list(actions) == [flag_name(field) for field in FIELDS]
    for field in FIELDS:
        action = actions[flag_name(field)]
        assert action.dest == field.name
        expected = f"{setting_help(field).text} (default: {shown_default(field)})"
        assert action.help == expected.replace("%", "%%")  # argparse's escape


def test_cli_defaults_are_the_settings_defaults() -> None:
    args = build_parser().parse_args(["serve"])
    assert serve_settings(args, environ={}) == Settings()


def test_settings_the_engine_has_too_default_to_the_engines() -> None:
    engine = attrs.fields_dict(EngineConfig)
    shared = [f for f in FIELDS if f.name in engine and engine[f.name].default is not attrs.NOTHING]
    assert {field.name for field in shared} >= {"max_concurrency", "max_queue"}
    for field in shared:
        assert field.default == engine[field.name].default, field.name


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--port", "7"], {"MLX_NURSERY_PORT": "9"}, {"port": 7}),
        ([], {"MLX_NURSERY_PORT": "9"}, {"port": 9}),
        (["--strict-params"], {}, {"strict_params": True}),
        ([], {"MLX_NURSERY_STRICT_PARAMS": "yes"}, {"strict_params": True}),
        (["--request-timeout", "2.5"], {}, {"request_timeout": 2.5}),
        ([], {"MLX_NURSERY_REQUEST_TIMEOUT": "off"}, {"request_timeout": None}),
        (["--prefill-chunk-ms", "0"], {}, {"prefill_chunk_ms": 0.0}),
        ([], {"MLX_NURSERY_PREFILL_CHUNK_MS": "120"}, {"prefill_chunk_ms": 120.0}),
        (["--model", "./m", "--max-queue", "0"], {}, {"model": "./m", "max_queue": 0}),
        (
            ["--kv-bits", "4"],
            {"MLX_NURSERY_KV_GROUP_SIZE": "32"},
            {"kv_bits": 4, "kv_group_size": 32},
        ),
    ],
)
def test_flags_then_environment_then_defaults(
    argv: list[str], environ: dict[str, str], expected: dict[str, Any]
) -> None:
    args = build_parser().parse_args(["serve", *argv])
    assert serve_settings(args, environ=environ) == Settings(**expected)


def test_an_unusable_value_names_the_setting() -> None:
    args = build_parser().parse_args(["serve", "--max-concurrency", "0"])
    with pytest.raises(SettingsError, match="max_concurrency"):
        serve_settings(args, environ={})
    with pytest.raises(SettingsError, match="MLX_NURSERY_PORT"):
        Settings.from_env({"MLX_NURSERY_PORT": "eighty"})
    with pytest.raises(SettingsError, match="kv_bits must be one of 4, 8, got 3"):
        serve_settings(build_parser().parse_args(["serve", "--kv-bits", "3"]), environ={})


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--api-key", ""], {}),
        (["--api-key", " "], {}),
        (["--api-key", "good", "--api-key", ""], {}),
        (["--admin-key", ""], {}),
        (["--api-key-file", " "], {}),
        ([], {"MLX_NURSERY_API_KEY": " , "}),
        ([], {"MLX_NURSERY_API_KEY": "good,"}),
        ([], {"MLX_NURSERY_API_KEY": ""}),
        ([], {"MLX_NURSERY_ADMIN_KEY": ""}),
        ([], {"MLX_NURSERY_API_KEY_FILE": ""}),
    ],
)
def test_an_empty_key_stops_the_start(argv: list[str], environ: dict[str, str]) -> None:
    """An empty key would serve the API with no key at all, silently."""
    args = build_parser().parse_args(["serve", *argv])
    with pytest.raises(SettingsError, match="empty"):
        serve_settings(args, environ=environ)


def test_keys_are_taken_as_given_around_their_spaces() -> None:
    settings = Settings.from_env({"MLX_NURSERY_API_KEY": " a , b "}, admin_key=["root"])
    assert (settings.api_key, settings.admin_key) == (("a", "b"), ("root",))
