"""Settings are the one place defaults are stated: the CLI and README's table must agree.

A default changed in settings/ alone fails the README check; one restated in README alone
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
from mlx_nursery.serving._reservations import MIN_PREFIX_CACHE_BYTES
from mlx_nursery.settings import (
    Settings,
    SettingsError,
    flag_name,
    setting_help,
    shown_default,
)

README = Path(__file__).resolve().parents[2] / "README.md"
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
        if field.name == "prompt_cache_bytes":
            # The server sizes it per model from its memory share (serving/_reservations.py),
            # never below the engine's own default.
            assert field.default is None
            assert engine[field.name].default == MIN_PREFIX_CACHE_BYTES
            continue
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
            ["--prompt-cache-disk-bytes", "2GiB"],
            {"MLX_NURSERY_PROMPT_CACHE_DIR": "/var/cache/kv"},
            {"prompt_cache_disk_bytes": 2 << 30, "prompt_cache_dir": "/var/cache/kv"},
        ),
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


SIZES_AND_TIMES = [f for f in FIELDS if setting_help(f).unit]


def test_every_size_and_duration_setting_takes_units() -> None:
    """A setting named as a size or a time must read units: a new one that forgot to say
    so would take `2GiB` as a bad number."""
    named = {
        f.name
        for f in FIELDS
        if f.name.endswith(
            ("_bytes", "_budget", "_seconds", "_timeout", "_grace", "_age", "_bytes_per_key")
        )
        or f.name == "body_min_rate"  # bytes per second: read as a size
    }
    assert named == {f.name for f in SIZES_AND_TIMES}


@pytest.mark.parametrize(
    "field", [f for f in SIZES_AND_TIMES if f.default is not None], ids=lambda f: f.name
)
def test_the_default_as_help_prints_it_reads_back_by_flag_and_environment(
    field: attrs.Attribute[Any],
) -> None:
    shown = shown_default(field)
    by_flag = build_parser().parse_args(["serve", flag_name(field), shown])
    assert getattr(serve_settings(by_flag, environ={}), field.name) == field.default
    by_env = Settings.from_env({f"MLX_NURSERY_{field.name.upper()}": shown})
    assert getattr(by_env, field.name) == field.default


@pytest.mark.parametrize(
    ("flag", "text", "expected"),
    [
        ("--memory-budget", "2GiB", 2 << 30),
        ("--memory-budget", "1GB", 10**9),
        ("--prompt-cache-bytes", "512MiB", 512 << 20),
        ("--kv-cache-bytes", "1.5 GiB", 3 << 29),
        ("--max-request-bytes", "64KiB", 64 << 10),
        ("--max-image-bytes", "3MB", 3 * 10**6),
        ("--max-audio-bytes", "100", 100),
        ("--request-timeout", "90s", 90.0),
        ("--request-timeout", "1m", 60.0),
        ("--shutdown-grace", "1.5m", 90.0),
        ("--responses-max-age", "2h", 7200.0),
        ("--responses-max-age", "7d", 7 * 86400.0),
        ("--image-fetch-timeout", "500ms", 0.5),
        ("--max-audio-seconds", "10min", 600.0),
    ],
)
def test_sizes_and_durations_read_units_in_flags_and_environment(
    flag: str, text: str, expected: float
) -> None:
    name = flag[2:].replace("-", "_")
    by_flag = serve_settings(build_parser().parse_args(["serve", flag, text]), environ={})
    assert getattr(by_flag, name) == expected
    by_env = serve_settings(
        build_parser().parse_args(["serve"]), environ={f"MLX_NURSERY_{name.upper()}": text}
    )
    assert getattr(by_env, name) == expected


@pytest.mark.parametrize(
    ("flag", "text", "message"),
    [
        ("--memory-budget", "2XB", "is not a size: unknown size unit 'XB'"),
        ("--prompt-cache-bytes", "2G", "is not a size: unknown size unit 'G'"),
        ("--request-timeout", "5y", "is not a duration: unknown time unit 'y'"),
        ("--shutdown-grace", "soon", "is not a duration"),
        ("--max-request-bytes", "-1MiB", "is not a size"),
    ],
)
def test_a_bad_unit_is_a_settings_error_naming_the_flag_or_variable(
    flag: str, text: str, message: str
) -> None:
    with pytest.raises(SettingsError, match=f"^{flag}='{re.escape(text)}' {message}"):
        serve_settings(build_parser().parse_args(["serve", f"{flag}={text}"]), environ={})
    variable = "MLX_NURSERY_" + flag[2:].replace("-", "_").upper()
    with pytest.raises(SettingsError, match=f"^{variable}='{re.escape(text)}' {message}"):
        Settings.from_env({variable: text})
