"""The `mlx-nursery` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings


def _make_model(args: argparse.Namespace) -> int:
    from .tools import make_model

    try:
        path = make_model(args.out, args.preset, dtype=args.dtype, seed=args.seed, bits=args.bits)
    except (ModuleNotFoundError, ValueError) as exc:  # an extra not installed; bad bits
        print(f"error: {exc}", file=sys.stderr)
        return 2
    quantized = "" if args.bits is None else f", {args.bits}-bit"
    print(f"wrote {args.preset} model ({args.dtype}{quantized}, seed {args.seed}) to {path}")
    return 0


def _make_adapter(args: argparse.Namespace) -> int:
    from .tools import make_adapter

    keys = [k.strip() for k in args.keys.split(",") if k.strip()]
    try:
        path = make_adapter(
            args.out, args.base, seed=args.seed, rank=args.rank, layers=args.layers, keys=keys
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a rank-{args.rank} LoRA adapter (seed {args.seed}) to {path}")
    return 0


def _convert_gguf(args: argparse.Namespace) -> int:
    from .tools import GGUFConversionError, convert_gguf

    try:
        out = convert_gguf(
            args.gguf,
            args.out,
            scales_dtype=args.scales_dtype,
            progress=lambda m: print(m, file=sys.stderr),
        )
    except GGUFConversionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote an MLX model to {out}")
    return 0


def _convert_ct2_whisper(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .tools import CT2FormatError, convert_ct2_whisper

    try:
        out = convert_ct2_whisper(Path(args.source), Path(args.out))
    except (CT2FormatError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote an mlx-audio Whisper to {out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import trio

    from .logs import configure_logging
    from .models import ModelNotFoundError, resolve_model_path
    from .models.default import DefaultModelError, ensure_default_model
    from .server import serve
    from .serving import model_sources
    from .settings import SettingsError
    from .testing import harness

    try:
        settings = serve_settings(args)
        if settings.distributed is not None:
            from .distributed import distributed_settings

            settings = distributed_settings(settings)
        sources = model_sources(settings)
        # the scripted model's field, --fault-rate, connection drops; a bad --fault or
        # --script file stops the start, as a bad flag does
        extensions = (harness(settings),)
        unknown = set(settings.preload) - {source.name for source in sources}
        if unknown:
            raise SettingsError(f"--preload names no served model: {', '.join(sorted(unknown))}")
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:  # every model is found before the server starts; each loads when it is first used
        for source in sources:
            if source.spec is None:
                ensure_default_model(lambda m: print(m, file=sys.stderr))
            else:
                resolve_model_path(source.spec)
    except (ModelNotFoundError, DefaultModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if settings.distributed is not None:  # under mlx.launch: rank 0 serves, the others follow
        from .distributed import start_rank

        try:
            (source,) = sources  # distributed_settings allows one model
            status = start_rank(settings, source.spec)
        except SettingsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if status is not None:
            return status
    return trio.run(partial(serve, settings, extensions=extensions))


def serve_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """The settings `serve` runs with: its flags, then `MLX_NURSERY_*` (environ), then defaults.

    A flag not given parses to None, so that the environment and Settings' defaults apply.
    Raises SettingsError for a value that cannot be used."""
    import attrs

    from .settings import Settings

    overrides = {field.name: getattr(args, field.name) for field in attrs.fields(Settings)}
    return Settings.from_env(environ, **overrides)


def build_parser() -> argparse.ArgumentParser:
    from .tools import PRESETS

    parser = argparse.ArgumentParser(prog="mlx-nursery", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser(
        "make-model", help="write a random-weight model directory offline (tests, benchmarks)"
    )
    make.add_argument("out", help="output directory")
    make.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    make.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--bits", type=int, choices=[4, 8], help="quantize the weights (text models)")
    make.set_defaults(handler=_make_model)

    adapter = commands.add_parser(
        "make-adapter", help="write a random LoRA adapter for a model (tests, benchmarks)"
    )
    adapter.add_argument("out", help="output directory")
    adapter.add_argument("--base", required=True, help="the model directory it adapts")
    adapter.add_argument("--seed", type=int, default=0)
    adapter.add_argument("--rank", type=int, default=8)
    adapter.add_argument("--layers", type=int, default=2, help="the last K blocks are adapted")
    adapter.add_argument(
        "--keys", default="q_proj,v_proj", help="projections adapted, comma-separated"
    )
    adapter.set_defaults(handler=_make_adapter)

    serve = commands.add_parser(
        "serve",
        help="serve the OpenAI-compatible API",
        description="Each flag can also be set as MLX_NURSERY_<FLAG> (e.g. MLX_NURSERY_PORT)."
        " Sizes take B, KB, MB, GB, KiB, MiB, GiB (2GiB); durations ms, s, m, h, d (90s).",
    )
    _add_settings_flags(serve)
    serve.set_defaults(handler=_serve)

    convert = commands.add_parser(
        "convert-gguf", help="convert a llama-family GGUF (Q4_0, Q4_1, Q8_0, F16, F32) to MLX"
    )
    convert.add_argument("gguf", help="input .gguf file")
    convert.add_argument("out", help="output model directory")
    convert.add_argument(
        "--scales-dtype",
        choices=["float32", "float16"],
        default=None,
        help="dtype of quantization scales (default: float32 on CPU, else float16)",
    )
    convert.set_defaults(handler=_convert_gguf)

    whisper = commands.add_parser(
        "convert-ct2-whisper",
        help="convert a CTranslate2 (faster-whisper) Whisper directory to an mlx-audio one",
    )
    whisper.add_argument("source", help="directory with model.bin, config.json, tokenizer.json")
    whisper.add_argument("out", help="output model directory")
    whisper.set_defaults(handler=_convert_ct2_whisper)
    return parser


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field, its help and shown default from the field (settings/)."""
    import attrs

    from .settings import (
        Settings,
        flag_name,
        repeatable,
        setting_help,
        shown_default,
        takes_units,
        value_type,
    )

    for field in attrs.fields(Settings):
        text = f"{setting_help(field).text} (default: {shown_default(field)})".replace("%", "%%")
        flag, kind = flag_name(field), value_type(field)
        # default None: a flag not given leaves the choice to MLX_NURSERY_* and Settings.
        # A size or a duration stays text here: Settings reads its units (`2GiB`, `90s`)
        # as it reads the environment's, with the same errors.
        if takes_units(field):
            kind = str
        if kind is bool:
            parser.add_argument(
                flag, dest=field.name, action="store_const", const=True, default=None, help=text
            )
        elif repeatable(field):
            parser.add_argument(flag, dest=field.name, action="append", default=None, help=text)
        else:
            parser.add_argument(flag, dest=field.name, type=kind, default=None, help=text)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


def run() -> None:
    """Console entry point: run a command, then release MLX's streams before exit."""
    try:
        status = main()
    finally:
        if "mlx.core" in sys.modules:  # else nothing to release, and no need to load the runtime
            from .models import release_mlx_streams

            release_mlx_streams()
    sys.exit(status)


if __name__ == "__main__":
    run()
