"""The `mlx-nursery` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _make_model(args: argparse.Namespace) -> int:
    from .models import make_model

    path = make_model(args.out, args.preset, dtype=args.dtype, seed=args.seed)
    print(f"wrote {args.preset} model ({args.dtype}, seed {args.seed}) to {path}")
    return 0


def _convert_gguf(args: argparse.Namespace) -> int:
    from .models.gguf import GGUFConversionError, convert_gguf

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


def _serve(args: argparse.Namespace) -> int:
    import trio

    from .models import ModelNotFoundError, resolve_model_path
    from .models.default import DefaultModelError, ensure_default_model
    from .server import serve
    from .settings import Settings, SettingsError

    overrides = {name: getattr(args, name) for name in _SERVE_FLAGS}
    try:
        settings = Settings.from_env(**overrides)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _configure_logging(settings.log_level)
    try:
        if settings.model is None:
            ensure_default_model(lambda m: print(m, file=sys.stderr))
        else:
            resolve_model_path(settings.model)
    except (ModelNotFoundError, DefaultModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return trio.run(serve, settings)


def _configure_logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# flag -> (type, help); each also reads MLX_NURSERY_<FLAG> (see settings.py)
_SERVE_FLAGS: dict[str, tuple[type, str]] = {
    "model": (str, "local model directory or cached HF repo id (default: SmolLM2-135M-Instruct)"),
    "host": (str, "address to bind (default 127.0.0.1)"),
    "port": (int, "port to bind (default 8000)"),
    "max_concurrency": (int, "sequences on the device at once; 1 serializes (default 8)"),
    "max_queue": (int, "requests waiting for a lane before 503 (default 64)"),
    "request_timeout": (float, "seconds per request, queueing included (default 600)"),
    "default_max_tokens": (int, "max_tokens when a request sets none (default: context room)"),
    "served_model_name": (str, "the model id clients use (default: the model's name)"),
    "prompt_cache_bytes": (int, "prefix KV cache budget in bytes; 0 disables (default 2 GiB)"),
    "stream_interval": (
        int,
        "tokens per chunk after the first; 0: by load, +1 per 8 open streams (default 0)",
    ),
    "shutdown_grace": (float, "seconds running requests get after SIGTERM (default 10)"),
    "log_level": (str, "debug, info, warning or error (default info)"),
    "responses_db": (str, "SQLite file of stored responses (default: user data dir; ':memory:')"),
    "responses_max": (int, "stored responses kept before the oldest are evicted (default 10000)"),
    "responses_max_age": (float, "seconds a stored response is kept (default 30 days)"),
    "max_request_bytes": (int, "largest request body in bytes; past it, 413 (default 8 MiB)"),
    "strict_params": (
        bool,
        (
            "refuse with a 400 the hints otherwise accepted and ignored "
            "(reasoning_effort, verbosity, ...; see x-ignored-params)"
        ),
    ),
}


def build_parser() -> argparse.ArgumentParser:
    from .models import PRESETS

    parser = argparse.ArgumentParser(prog="mlx-nursery", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser(
        "make-model", help="write a random-weight model directory offline (tests, benchmarks)"
    )
    make.add_argument("out", help="output directory")
    make.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    make.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    make.add_argument("--seed", type=int, default=0)
    make.set_defaults(handler=_make_model)

    serve = commands.add_parser(
        "serve",
        help="serve the OpenAI-compatible API",
        description="Each flag can also be set as MLX_NURSERY_<FLAG> (e.g. MLX_NURSERY_PORT).",
    )
    for name, (kind, text) in _SERVE_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            serve.add_argument(
                flag, dest=name, action="store_const", const=True, default=None, help=text
            )
        else:
            serve.add_argument(flag, dest=name, type=kind, default=None, help=text)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


def run() -> None:
    """Console entry point: run a command, then release MLX's streams before exit."""
    try:
        status = main()
    finally:
        release_mlx_streams()
    sys.exit(status)


def release_mlx_streams() -> None:
    """Destroy this thread's MLX streams; MLX aborts at exit otherwise (ml-explore/mlx#4327).

    Call it last: this thread can make no MLX call afterwards."""
    if "mlx.core" in sys.modules:
        import mlx.core as mx

        mx.synchronize()
        mx.clear_streams()


if __name__ == "__main__":
    run()
