"""A lone stream's host time per token: the engine thread against a bare decode loop.

A lone stream of a large model is host-bound (docs/decisions/0009): building each step's
graph and launching it take about as long as the device's work, so every bit of Python the
engine thread runs per token beyond what mlx-lm's `generate_step` runs shows up in the time
per output token, and so does the Python the Trio thread runs while the engine thread
wants the GIL. Here both are measured as CPU time, on a small model in this process, which
makes them visible on any machine:

  bare     `generate_step` with mlx-lm's own sampler, in this thread: its CPU time per token,
           and the part of it outside the model's forward and `mx.async_eval` (`own`);
  engine   the engine's lone stream (the fast path), consumed as `bench/engine.py` consumes
           it: per token, the engine thread's CPU time (`host`), the part of it outside the
           model's forward and `mx.async_eval` (`own`: the engine's bookkeeping, sampling's
           graph, posting to Trio), and the Trio thread's (this one: delivering,
           detokenizing in the consumer);
  base     with `--baseline DIR`, the same for another copy of the engine's code, importable
           from DIR as the package `mlx_nursery_base` (all its imports are relative), e.g.
           `git archive main src/mlx_nursery | tar -x --strip-components=1 -C /tmp/b &&
           mv /tmp/b/mlx_nursery /tmp/b/mlx_nursery_base`: a change against its base in
           one run.

CPU time, not wall time: on the CPU backend MLX computes on threads of its own, so the
calling thread's CPU time is its host work, waits excluded. The engines run mlx-lm's model
unchanged (no fused projections, unless `--fuse-weights`), so that every side builds the
same graph. Each round runs the sides in an order mirrored every other round, a greedy and a
sampled stream each, so that a machine other work slows slows every side; a round's ratio
is one side's mean over another's, and the median over rounds is reported.

`--profile` also runs the engine thread under cProfile during its streams.

Usage:
  python -P bench/solo_host.py --preset tiny --tokens 256 --rounds 8
  python -P bench/solo_host.py --preset tiny --baseline /tmp/b --rounds 10
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import importlib
import io
import json
import pstats
import statistics
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import trio

import mlx_nursery
from mlx_nursery.engine import _worker
from mlx_nursery.tools import make_model

SAMPLINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "sampled": {"temperature": 0.7, "top_p": 0.9, "seed": 7},
}
IN_MODEL: collections.defaultdict[int, float] = collections.defaultdict(float)
"""Per thread: CPU seconds in the model's forward and in `mx.async_eval`."""


def thread_cpu(ident: int) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def metered(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            IN_MODEL[threading.get_ident()] += time.thread_time() - started

    return call


def meter_model(package: types.ModuleType) -> None:
    """Count the model's forwards and the launches of `package`'s fast path in `IN_MODEL`."""
    shapes = importlib.import_module(package.__name__ + ".engine._shapes")
    shapes.ShapeWatch.__call__ = metered(shapes.ShapeWatch.__call__)
    mlx = types.SimpleNamespace(**{name: getattr(mx, name) for name in dir(mx)})
    mlx.async_eval = metered(mx.async_eval)
    for name in ("_solo_sequence", "_speculating"):  # their launches (a verify's too)
        module: Any = importlib.import_module(f"{package.__name__}.engine.{name}")
        module.mx = mlx


class MeteredModel:
    """A model whose forwards count in `IN_MODEL` (attributes are the model's)."""

    def __init__(self, model: Any) -> None:
        self._forward = metered(model)
        self._model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def meter_bare() -> None:
    """Count `generate_step`'s launches in `IN_MODEL`."""
    generate: Any = importlib.import_module("mlx_lm.generate")  # the module, not the function
    mlx = types.SimpleNamespace(**{name: getattr(mx, name) for name in dir(mx)})
    mlx.async_eval = metered(mx.async_eval)
    generate.mx = mlx


def bare(model: Any, prompt: list[int], tokens: int, sampling: dict[str, Any]) -> dict[str, float]:
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(temp=sampling["temperature"], top_p=sampling.get("top_p", 1.0))
    me = threading.get_ident()
    wall, cpu, in_model = time.perf_counter(), time.thread_time(), IN_MODEL[me]
    for _ in generate_step(mx.array(prompt), model, max_tokens=tokens, sampler=sampler):
        pass
    host = time.thread_time() - cpu
    return {
        "host_us": 1e6 * host / tokens,
        "own_us": 1e6 * (host - (IN_MODEL[me] - in_model)) / tokens,
        "wall_us": 1e6 * (time.perf_counter() - wall) / tokens,
    }


class Side:
    """One engine package's engine, run in this process."""

    def __init__(self, package: types.ModuleType) -> None:
        self.package = package
        self.engine: Any = None
        self.ident = 0

    async def start(
        self, nursery: trio.Nursery, path: Path, fuse: bool, *, speculating: bool = False
    ) -> None:
        engine_module = importlib.import_module(self.package.__name__ + ".engine")
        before = {t.ident for t in threading.enumerate()}
        speculation = engine_module.Speculation() if speculating else None
        config = engine_module.EngineConfig(path, fuse_weights=fuse, speculation=speculation)
        self.engine = await nursery.start(engine_module.Engine(config).run)
        (self.ident,) = [
            t.ident
            for t in threading.enumerate()
            if t.ident not in before and t.name == "mlx-nursery-engine" and t.ident is not None
        ]

    async def run(
        self, prompt: list[int], tokens: int, sampling: dict[str, Any]
    ) -> dict[str, float]:
        engine_module = importlib.import_module(self.package.__name__ + ".engine")
        request = engine_module.GenerationRequest(
            prompt,
            max_tokens=tokens,
            sampling=engine_module.SamplingParams(**sampling),
            ignore_eos=True,
        )
        ident = self.ident
        wall, cpu, trio_cpu, model = (
            time.perf_counter(), thread_cpu(ident), time.thread_time(), IN_MODEL[ident]
        )  # fmt: skip
        async with self.engine.generate(request) as stream:
            async for _ in stream:
                pass
        host = thread_cpu(ident) - cpu
        return {
            "host_us": 1e6 * host / tokens,
            "own_us": 1e6 * (host - (IN_MODEL[ident] - model)) / tokens,
            "trio_us": 1e6 * (time.thread_time() - trio_cpu) / tokens,
            "wall_us": 1e6 * (time.perf_counter() - wall) / tokens,
        }


class LoopProfile:
    """The engine thread's steps under cProfile while `on` (set from the Trio thread)."""

    def __init__(self) -> None:
        self.on = False
        self.profile = cProfile.Profile()

    def install(self) -> None:
        loop: Callable[..., None] = _worker.Worker._loop
        probe = self

        @functools.wraps(loop)
        def profiled(worker: Any, runner: Any) -> None:
            step, settle = runner.step, runner.settle

            def profiled_step() -> None:  # enabled for a step, disabled after its settle
                if probe.on:
                    probe.profile.enable()
                step()

            def settled() -> None:
                settle()
                probe.profile.disable()

            runner.step, runner.settle = profiled_step, settled
            loop(worker, runner)

        _worker.Worker._loop = profiled  # type: ignore[assignment, method-assign]

    def report(self, top: int) -> str:
        out = io.StringIO()
        pstats.Stats(self.profile, stream=out).sort_stats("tottime").print_stats(top)
        return out.getvalue()


def summary(rows: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Per side, the median of each figure; per pair of sides, the median of the rounds'
    ratios of their CPU per token; per engine, the median of the rounds' host work per token
    beyond the bare loop's (`own_us` less bare's: the model's forward and the launches are
    the same graph on every side)."""
    out: dict[str, Any] = {
        side: {key: statistics.median(row[side][key] for row in rows) for key in figures}
        for side, figures in rows[0].items()
    }
    for a, b, key in (("engine", "bare", "host_us"), ("base", "bare", "host_us"),
                      ("engine", "base", "host_us"), ("engine", "base", "own_us")):  # fmt: skip
        if a in rows[0] and b in rows[0]:
            ratios = [row[a][key] / row[b][key] for row in rows]
            out[f"{a}/{b} {key}"] = statistics.median(ratios)
    for a in ("engine", "base"):  # the host work a side adds to the bare loop's, per token
        if a in rows[0]:
            extra = [row[a]["own_us"] - row["bare"]["own_us"] for row in rows]
            out[f"{a} - bare own_us"] = statistics.median(extra)
    return out


async def run(args: argparse.Namespace, path: Path, profile: LoopProfile | None) -> dict[str, Any]:
    from mlx_lm.utils import load

    model = MeteredModel(load(str(path))[0])
    meter_bare()
    prompt = list(range(10, 10 + args.prompt_tokens))
    sides = {"engine": Side(mlx_nursery)}
    if args.baseline:
        sys.path.insert(0, args.baseline)
        sides["base"] = Side(importlib.import_module("mlx_nursery_base"))
    for side in sides.values():
        meter_model(side.package)
    rows: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in SAMPLINGS}
    async with trio.open_nursery() as nursery:
        for name, side in sides.items():
            await side.start(
                nursery, path, args.fuse_weights, speculating=args.speculation and name == "engine"
            )

        async def one(name: str, sampling: dict[str, Any]) -> dict[str, float]:
            if name == "bare":
                return bare(model, prompt, args.tokens, sampling)
            if profile is not None and name == "engine":
                profile.on = True
            try:
                return await sides[name].run(prompt, args.tokens, sampling)
            finally:
                if profile is not None:
                    profile.on = False

        order = ["bare", *sides]
        for sampling in SAMPLINGS.values():  # warm-up, every side
            for name in order:
                await one(name, sampling)
        for r in range(args.rounds):
            ordered = order if r % 2 == 0 else order[::-1]
            for kind, sampling in SAMPLINGS.items():
                runs: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
                for name in ordered + ordered[::-1]:
                    runs[name].append(await one(name, sampling))
                rows[kind].append(
                    {
                        n: {k: statistics.fmean(x[k] for x in v) for k in v[0]}
                        for n, v in runs.items()
                    }
                )
        for side in sides.values():
            side.engine.close()
    return {kind: summary(kind_rows) for kind, kind_rows in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--model", help="an existing model directory (default: make --preset)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--baseline", help="a directory holding the package mlx_nursery_base")
    parser.add_argument(
        "--fuse-weights",
        action="store_true",
        help="the engines fuse their projections, as they serve (the bare loop never does)",
    )
    parser.add_argument(
        "--speculation",
        action="store_true",
        help="the engine side drafts by prompt lookup (adaptive; the base does not): with "
        "--baseline a copy of the same code, the host work speculation adds per token",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    profile = LoopProfile() if args.profile else None
    if profile is not None:
        profile.install()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else make_model(Path(tmp) / "m", args.preset)
        result = trio.run(run, args, path, profile)
    print(json.dumps(result, indent=2))
    if profile is not None:
        print("engine thread, its steps and settles:")
        print(profile.report(args.top))


if __name__ == "__main__":
    main()
