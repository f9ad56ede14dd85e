"""A lone stream's host time per token: the engine thread against a bare decode loop.

A lone stream of a large model is host-bound (docs/decisions/0009): building each step's
graph and launching it take about as long as the device's work, so every bit of Python the
engine thread runs per token beyond what mlx-lm's `generate_step` runs shows up in the time
per output token, and so does the Python the Trio thread runs while the engine thread
wants the GIL. Here both are measured as CPU time, on a small model in this process, which
makes them visible on any machine:

  bare     `generate_step` with mlx-lm's own sampler, in this thread: this thread's CPU
           time per token;
  engine   the engine's lone stream (the fast path), consumed as `bench/engine.py` consumes
           it: the engine thread's CPU time per token, and the Trio thread's (this one:
           delivering, detokenizing in the consumer);
  wall     each side's time per token.

CPU time, not wall time: on the CPU backend MLX computes on threads of its own, so the
calling thread's CPU time is its host work (graph building, launching, the engine's
bookkeeping), waits excluded. The engine runs mlx-lm's model unchanged (no fused
projections, unless `--fuse-weights`), so that both sides build the same graph. Each round
runs bare, engine, engine, bare (mirrored every other round), a greedy and a sampled
stream each time, so that a machine other work slows slows both sides; a round's ratio is
the engine's mean over bare's, and the median over rounds is reported.

`--profile` also runs the engine thread under cProfile during its streams and prints the
functions by their own time.

Usage:
  python -P bench/solo_host.py --preset tiny --tokens 256 --rounds 8
  python -P bench/solo_host.py --model /tmp/small --profile
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import trio

from mlx_nursery.engine import EngineConfig, GenerationRequest, SamplingParams, _worker, open_engine
from mlx_nursery.tools import make_model

ENGINE_THREAD = "mlx-nursery-engine"
SAMPLINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "sampled": SamplingParams(temperature=0.7, top_p=0.9, seed=7),
}


def thread_cpu(ident: int) -> float:
    """Seconds of CPU the thread `ident` has run."""
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def engine_ident() -> int:
    (thread,) = [t for t in threading.enumerate() if t.name == ENGINE_THREAD]
    assert thread.ident is not None
    return thread.ident


def bare(model: Any, prompt: list[int], tokens: int, sampler: Any) -> dict[str, float]:
    from mlx_lm.generate import generate_step

    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in generate_step(mx.array(prompt), model, max_tokens=tokens, sampler=sampler):
        pass
    return {"host_us": 1e6 * (time.thread_time() - cpu) / tokens,
            "wall_us": 1e6 * (time.perf_counter() - wall) / tokens}  # fmt: skip


async def engine_run(engine: Any, request: GenerationRequest) -> dict[str, float]:
    ident = engine_ident()
    wall, cpu, trio_cpu = time.perf_counter(), thread_cpu(ident), time.thread_time()
    async with engine.generate(request) as stream:
        async for _ in stream:
            pass
    n = request.max_tokens
    return {
        "host_us": 1e6 * (thread_cpu(ident) - cpu) / n,
        "trio_us": 1e6 * (time.thread_time() - trio_cpu) / n,
        "wall_us": 1e6 * (time.perf_counter() - wall) / n,
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

        _worker.Worker._loop = profiled  # type: ignore[method-assign,assignment]

    def report(self, top: int) -> str:
        out = io.StringIO()
        pstats.Stats(self.profile, stream=out).sort_stats("tottime").print_stats(top)
        return out.getvalue()


async def run(args: argparse.Namespace, path: Path, profile: LoopProfile | None) -> dict[str, Any]:
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load

    model = load(str(path))[0]
    prompt = list(range(10, 10 + args.prompt_tokens))
    config = EngineConfig(path, fuse_weights=args.fuse_weights)
    rounds: dict[str, list[dict[str, float]]] = {}
    async with open_engine(config) as engine:

        async def engine_side(name: str) -> dict[str, float]:
            request = GenerationRequest(
                prompt, max_tokens=args.tokens, sampling=SAMPLINGS[name], ignore_eos=True
            )
            if profile is not None:
                profile.on = True
            try:
                return await engine_run(engine, request)
            finally:
                if profile is not None:
                    profile.on = False

        async def bare_side(name: str) -> dict[str, float]:
            sampling = SAMPLINGS[name]
            sampler = make_sampler(temp=sampling.temperature, top_p=sampling.top_p)
            return bare(model, prompt, args.tokens, sampler)

        for name in SAMPLINGS:  # warm-up, both sides
            await bare_side(name)
            await engine_side(name)
        for r in range(args.rounds):
            outer, inner = (bare_side, engine_side) if r % 2 == 0 else (engine_side, bare_side)
            for name in SAMPLINGS:
                runs = [await side(name) for side in (outer, inner, inner, outer)]
                b = runs[0::3] if outer is bare_side else runs[1:3]
                e = runs[1:3] if outer is bare_side else runs[0::3]
                row = {f"bare_{k}": statistics.fmean(x[k] for x in b) for k in b[0]}
                row.update({f"engine_{k}": statistics.fmean(x[k] for x in e) for k in e[0]})
                row["host_ratio"] = row["engine_host_us"] / row["bare_host_us"]
                row["wall_ratio"] = row["engine_wall_us"] / row["bare_wall_us"]
                rounds.setdefault(name, []).append(row)
    return {
        name: {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        | {"host_ratios": [round(row["host_ratio"], 3) for row in rows]}
        for name, rows in rounds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--model", help="an existing model directory (default: make --preset)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--fuse-weights",
        action="store_true",
        help="the engine fuses its projections, as it serves (the bare loop never does)",
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
