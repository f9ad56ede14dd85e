"""The engine's batched decode step alone, against mlx-lm's: host time and kernels a step.

A running batch of `--rows` rows with `--context` prompt tokens each (varied, random
tokens), every row decoding, nothing joining or leaving: the step the engine repeats
between arrivals. Two variants, each in this process one after the other, on one model
directory:

  ours     the engine's `BatchStepper` on the model as the engine loads it (fused
           projections, the ragged KV cache, the ragged decode-attention kernel on CUDA,
           one keyed sampler per row, as requests bring them);
  ours-prelude
           the same with the one-kernel decode prelude in the batch's step too
           (`_decode_prelude.BATCHES`; the engine takes it for lone sequences only);
  mlx_lm   mlx-lm's own `BatchGenerator` on mlx-lm's model (its `BatchKVCache`, one
           sampler for the batch): what mlx_lm.server decodes with.

Per variant, over `--steps` steps after `--warmup` steps: wall ms a step, ms in MLX's
`async_eval` a step (encoding and launching), in `eval` (waiting for the device), and the
rest (Python: building the step's graph, bookkeeping), and with `--kernels` (torch.profiler, on the
GPU machine) CUDA kernels a step by name and the device's busy ms a step. The kernels by
name say what a step launches beyond mlx-lm's: that is the host time to win back. MLX's CUDA
graphs follow `MLX_USE_CUDA_GRAPHS` (the package sets it off where unset, as the engine
serves; `MLX_USE_CUDA_GRAPHS=1` measures with them); the report records it. MLX's cache of
freed buffers is bounded for ours as the engine bounds it, and MLX's default for mlx-lm's.

Usage:
  python -P bench/batch_step.py --preset tiny --layers 32 --rows 32 --context 200:400  # CPU
  python -P bench/batch_step.py --model /tmp/l8b --rows 32 --context 500:1000 \\
      --kernels --out batch-step.json                                             # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing
from _kernels import profile_steps

_real_async_eval = mx.async_eval
_real_eval = mx.eval


class Clock:
    """Time spent in one MLX function (every caller reads it through the module)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.seconds = 0.0

    def __call__(self, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.seconds += time.perf_counter() - start


def count_primitives(step: Callable[[], None]) -> dict[str, int]:
    """The primitives one step hands `mx.async_eval`, by name (`mx.export_to_dot`): on the
    CPU, a proxy for the kernels a GPU step launches (not every primitive is one kernel,
    and some launch copies of their inputs)."""
    counts: Counter[str] = Counter()
    dot = Path(tempfile.mkdtemp()) / "step.dot"

    def counted(*args: Any) -> Any:
        arrays = [a for a in _flat(args) if isinstance(a, mx.array)]
        mx.export_to_dot(str(dot), *arrays)
        counts.update(re.findall(r'label ="([^"]+)"', dot.read_text()))
        # mlx's stub leaves async_eval's parameters untyped
        return _real_async_eval(*args)  # type: ignore[no-untyped-call]

    mx.async_eval = counted
    try:
        step()
    finally:
        mx.async_eval = _real_async_eval
    return dict(counts.most_common())


def _flat(values: Any) -> list[Any]:
    if isinstance(values, (list, tuple)):
        return [leaf for v in values for leaf in _flat(v)]
    return [values]


def _prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    low, high = args.context
    return [
        [rng.randrange(100, vocab) for _ in range(rng.randint(low, high))] for _ in range(args.rows)
    ]


def ours(
    path: Path, args: argparse.Namespace, prelude: bool = False
) -> tuple[Any, Callable[[], None]]:
    from mlx_nursery.engine import SamplingParams, _decode_prelude, _fused_norm
    from mlx_nursery.engine._decode_attention import install
    from mlx_nursery.engine._sampling import make_request_sampler
    from mlx_nursery.engine._stepper import BatchStepper, Start
    from mlx_nursery.models import load_model

    loaded = load_model(path)
    assert loaded.model is not None, "a text model"
    install(loaded.model)
    _decode_prelude.install(loaded.model)
    _fused_norm.install(loaded.model)
    _decode_prelude.BATCHES = prelude
    stepper = BatchStepper(
        loaded.model,
        max_concurrency=args.rows,
        prefill_batch_size=8,
        prefill_step_size=2048,
    )
    vocab = int(loaded.model.args.vocab_size)
    for i, prompt in enumerate(_prompts(args, vocab)):
        params = SamplingParams(temperature=args.temperature, seed=i)
        stepper.insert_row(
            Start(prompt, None, [], 1 << 20),
            sampler=make_request_sampler(params, []),
            processors=[],
            stop_ids=frozenset(),
        )

    def step() -> None:
        stepper.step()

    return stepper._generator, step


def mlx_lm(path: Path, args: argparse.Namespace) -> tuple[Any, Callable[[], None]]:
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    model, _ = load(str(path))
    generator = BatchGenerator(
        model,
        max_tokens=1 << 20,
        stop_tokens=[],
        sampler=make_sampler(temp=args.temperature),
        completion_batch_size=args.rows,
        prefill_batch_size=8,
        prefill_step_size=2048,
    )
    generator.insert(_prompts(args, int(model.args.vocab_size)))

    def step() -> None:
        generator.next()

    return generator, step


def measure(name: str, path: Path, args: argparse.Namespace, cache_limit: int) -> dict[str, Any]:
    if name == "mlx_lm":
        mx.set_cache_limit(cache_limit)  # MLX's default, as mlx_lm.server runs
        generator, step = mlx_lm(path, args)
    else:
        from mlx_nursery.engine._backend import bound_cuda_buffer_cache

        bound_cuda_buffer_cache()  # as the engine serves (decisions/0055)
        generator, step = ours(path, args, prelude=name == "ours-prelude")
    while len(generator._prompt_batch) or len(generator._generation_batch) < args.rows:
        step()  # the prompts' prefill, until every row decodes
    for _ in range(args.warmup):
        step()
    primitives = count_primitives(step) if args.graph else None
    mx.synchronize()
    launch, wait = Clock(_real_async_eval), Clock(_real_eval)
    mx.async_eval, mx.eval = launch, wait
    try:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        mx.synchronize()
        wall = time.perf_counter() - start
    finally:
        mx.async_eval, mx.eval = _real_async_eval, _real_eval
    kernels = profile_steps(step, min(args.steps, 16)) if args.kernels else None
    per_step = 1000 / args.steps
    result: dict[str, Any] = {
        "variant": name,
        "wall_ms_per_step": round(wall * per_step, 2),
        "launch_ms_per_step": round(launch.seconds * per_step, 2),
        "wait_ms_per_step": round(wait.seconds * per_step, 2),
        "python_ms_per_step": round((wall - launch.seconds - wait.seconds) * per_step, 2),
        "tok_per_s": round(args.rows * args.steps / wall, 1),
    }
    if kernels is not None:
        result["kernels"] = kernels
    if primitives is not None:
        result["primitives"] = {"total": sum(primitives.values()), "by_name": primitives}
    del generator, step
    mx.clear_cache()
    return result


def _make(out: Path, preset: str, layers: int | None) -> Path:
    """The preset's model; with `layers`, as deep as that (a narrow model as deep as a
    large one: on the CPU its step's host work weighs as a GPU's does)."""
    import attrs

    from mlx_nursery.tools import PRESETS, make_model

    if layers is not None:
        base = PRESETS[preset]
        preset = f"{preset}-{layers}-layers"
        PRESETS[preset] = attrs.evolve(
            base, name=preset, config={**base.config, "num_hidden_layers": layers}
        )
    path: Path = make_model(out, preset)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path)
    source.add_argument("--preset")
    parser.add_argument("--layers", type=int, help="with --preset: this many layers")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument(
        "--context",
        type=lambda t: tuple(int(x) for x in t.split(":")),
        default=(500, 1000),
        help="prompt tokens a row, LOW:HIGH",
    )
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument(
        "--variants", nargs="+", default=["ours", "mlx_lm"],
        choices=["ours", "ours-prelude", "mlx_lm"],
    )  # fmt: skip
    parser.add_argument("--kernels", action="store_true", help="torch.profiler (GPU machine)")
    parser.add_argument("--graph", action="store_true", help="count one step's primitives")
    parser.add_argument(
        "--attention-blocks",
        type=int,
        help="ours: the ragged decode attention's target blocks (rows split into slices below it)",
    )
    parser.add_argument(
        "--mlx-compiles",
        action="store_true",
        help="ours: the engine's CUDA kernels compiled by MLX, not its own NVRTC call (0057)",
    )
    parser.add_argument(
        "--own-compiles",
        action="store_true",
        help="ours: every CUDA kernel compiled by the engine's NVRTC call where it can, the"
        " decode attention's too (MLX compiles it by default, decisions/0060)",
    )
    parser.add_argument(
        "--fused-norms",
        action="store_true",
        help="ours: each residual add and the RMSNorm after it in one kernel (_fused_norm.py)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from mlx_nursery.engine import _decode_attention, _fused_norm, _own_kernels

    _fused_norm.ENABLED = args.fused_norms
    if args.attention_blocks:
        _decode_attention._TARGET_BLOCKS = args.attention_blocks
    if args.mlx_compiles:
        setattr(_own_kernels, "compiler", lambda: None)  # noqa: B010
    if args.own_compiles:
        _decode_attention.COMPILED_BY_MLX = False
    with tempfile.TemporaryDirectory() as scratch:
        path = args.model
        if path is None:
            path = _make(Path(scratch) / "model", args.preset, args.layers)
        cache_limit = mx.set_cache_limit(0)  # MLX's default, read
        mx.set_cache_limit(cache_limit)
        results = [measure(name, path, args, cache_limit) for name in args.variants]
    report = {
        "device": str(mx.default_device()),
        "cuda_graphs": os.environ.get("MLX_USE_CUDA_GRAPHS", "unset (MLX: on)"),
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
