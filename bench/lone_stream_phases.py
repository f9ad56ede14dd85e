"""Where does a lone stream's token time go on the engine thread? Median phase times, in rounds.

For each token the fast path produces (`SoloSequence`), on the engine's thread:
  build    from the start of the forward pass to the launch: Python building the graph
  post     posting the previous token to Trio just before the launch (Worker._post_at_launch)
  launch   `mx.async_eval`: MLX encoding and launching the step; it releases the GIL
  read     reading the token launched one step earlier (`item()`)
  between  from that read to the next forward pass: the worker's loop, or nothing when bare
  token    start to start of consecutive forward passes

Three ways, in alternating order each round: `engine` (the whole engine, tokens posted at
the next launch), `engine-post-now` (each token posted as soon as it is read, so its post
falls in `between`), and `bare` (the fast path stepped in a bare loop on the engine
thread, nothing posted to Trio until the end). The difference between `engine` and `bare`
is what the worker loop and the hop to Trio cost a token.

Usage: python bench/lone_stream_phases.py --model DIR [--rounds 12] [--json OUT]
Wraps private engine methods: a benchmark's probe, like bench/lone_stream_itl.py (whose
`BareFastPath` it reuses).
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)  # bench/http.py would shadow the standard library's http package

import functools
import importlib.util
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import trio

from mlx_nursery.cli import release_mlx_streams
from mlx_nursery.engine import (
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    _solo,
    _worker,
    open_engine,
)

PHASES = ("build", "post", "launch", "read", "between", "token")
WAYS = ("engine", "engine-post-now", "bare")


class PhaseStamps:
    """Stamps each forward pass: start, post start/end, launch start/end, and the read's end."""

    def __init__(self) -> None:
        self.on = False
        self.rows: list[dict[str, float]] = []
        self._current: dict[str, float] = {}
        forward, take = _solo.SoloSequence._forward, _solo.SoloSequence._take_in_flight
        flush, launch = _worker.Worker._flush, mx.async_eval
        stamps = self

        def stamped_forward(solo: Any, inputs: mx.array) -> Any:
            stamps._current = {"start": time.perf_counter()}
            return forward(solo, inputs)

        def stamped_flush(worker: Any, **kwargs: Any) -> None:
            stamps._current.setdefault("post_start", time.perf_counter())
            flush(worker, **kwargs)
            stamps._current.setdefault("post_end", time.perf_counter())

        def stamped_launch(*arrays: Any) -> None:
            stamps._current["launch_start"] = time.perf_counter()
            launch(*arrays)
            stamps._current["launch_end"] = time.perf_counter()

        def stamped_take(solo: Any, *, launch_next: bool) -> Any:
            response = take(solo, launch_next=launch_next)
            if stamps.on and launch_next and "launch_end" in stamps._current:
                stamps.rows.append({**stamps._current, "read_end": time.perf_counter()})
            return response

        _solo.SoloSequence._forward = stamped_forward  # type: ignore[method-assign]
        _solo.SoloSequence._take_in_flight = stamped_take  # type: ignore[method-assign]
        _worker.Worker._flush = stamped_flush  # type: ignore[method-assign]
        _solo.mx.async_eval = stamped_launch  # _solo's `mx` is mlx.core: all callers see it

    def phases(self) -> dict[str, float]:
        rows = self.rows[3:-3]  # the hook runs in every forward pass, posting or not
        ms = {
            "build": [r["post_start"] - r["start"] for r in rows],
            "post": [r["post_end"] - r["post_start"] for r in rows],
            "launch": [r["launch_end"] - r["launch_start"] for r in rows],
            "read": [r["read_end"] - r["launch_end"] for r in rows],
            "between": [b["start"] - a["read_end"] for a, b in itertools.pairwise(rows)],
            "token": [b["start"] - a["start"] for a, b in itertools.pairwise(rows)],
        }
        return {name: 1000 * statistics.median(values) for name, values in ms.items()}


@functools.cache
def _lone_stream_itl() -> Any:
    path = Path(__file__).with_name("lone_stream_itl.py")
    spec = importlib.util.spec_from_file_location("lone_stream_itl", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def measure(model_path: Path, rounds: int, tokens: int) -> dict[str, dict[str, list[float]]]:
    itl = _lone_stream_itl()
    stamps = PhaseStamps()  # before the engine starts: its sequences bind the wrapped flush
    prompt = itl.lone_prompt(model_path)[0]
    request = GenerationRequest(prompt, max_tokens=tokens, sampling=SamplingParams(temperature=0.0),
                                ignore_eos=True)
    results: dict[str, dict[str, list[float]]] = {w: {p: [] for p in PHASES} for w in WAYS}
    async with open_engine(EngineConfig(model_path, max_concurrency=32)) as engine:
        worker = engine._worker  # a benchmark's probe
        assert worker is not None
        bare = itl.BareFastPath(engine)

        async def run(way: str) -> None:
            worker._post_at_launch = way != "engine-post-now"
            bare.armed = way == "bare"
            try:
                await itl.engine_stamps(engine, request)
            finally:
                worker._post_at_launch, bare.armed = True, False

        for way in WAYS:  # warm-up
            await run(way)
        for r in range(rounds):
            for way in WAYS if r % 2 == 0 else reversed(WAYS):
                stamps.rows, stamps.on = [], True
                await run(way)
                stamps.on = False
                for phase, value in stamps.phases().items():
                    results[way][phase].append(value)
            print(f"round {r}: " + ", ".join(f"{w} {results[w]['token'][-1]:.3f} ms" for w in WAYS),
                  flush=True)
    return results


def main() -> None:
    itl = _lone_stream_itl()
    args = itl.arguments(__doc__, "bench/results/lone-stream-phases.json").parse_args()
    results = trio.run(measure, Path(args.model), args.rounds, args.tokens)
    medians = {w: {p: statistics.median(v) for p, v in phases.items()} for w, phases in results.items()}
    print(f"\nlone stream, median ms per token on the engine thread: {args.model} on {mx.default_device()}")
    print(f"  {'way':<16}" + "".join(f"{p:>9}" for p in PHASES))
    for way in WAYS:
        print(f"  {way:<16}" + "".join(f"{medians[way][p]:9.3f}" for p in PHASES))
    itl.write_results(args, median_ms=medians, rounds_ms=results)
    release_mlx_streams()


if __name__ == "__main__":
    main()
