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
