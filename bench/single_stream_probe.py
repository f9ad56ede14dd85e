"""Where does a lone stream lose time? Decode tok/s of the same greedy stream, layer by layer.

  raw-main     mlx_lm generate_step on the main thread (the benchmark's reference)
  raw-thread   generate_step on a plain worker thread
  solo-thread  our SoloSequence stepped in a loop on a worker thread
  worker       the engine's Worker on its thread, deliveries dropped (no Trio)
  engine       the whole engine, consumed from Trio

Usage: python bench/single_stream_probe.py --model DIR [--tokens 256] [--repeats 3]
Prints a table and writes JSON (bench/results/single-stream-probe.json by default).
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)  # bench/http.py would shadow the standard library's http package

import argparse
import json
import platform
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import trio

from mlx_nursery.engine import EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.engine._sampling import make_request_processors, make_request_sampler
from mlx_nursery.engine._solo import SoloSequence
from mlx_nursery.engine._worker import Delivery, Worker

GREEDY = SamplingParams(temperature=0.0)


def on_thread(fn: Callable[[], list[float]]) -> list[float]:
    out: list[list[float]] = []

    def body() -> None:
        try:
            out.append(fn())
        finally:
            mx.synchronize()
            mx.clear_streams()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return out[0]


def raw(model: Any, prompt: list[int], tokens: int, repeats: int) -> list[float]:
    from mlx_lm.generate import generate_step

    rates = []
    for _ in range(repeats + 1):
        n, first = 0, 0.0
        for _token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens):
            n += 1
            if n == 1:
                first = time.perf_counter()
        rates.append((n - 1) / (time.perf_counter() - first))
    return rates[1:]


def solo(model: Any, prompt: list[int], tokens: int, repeats: int) -> list[float]:
    rates = []
    for _ in range(repeats + 1):
        failures: list[BaseException] = []
        seq = SoloSequence(
            model, -1, prompt, cache=None, cached_tokens=0, sampler=make_request_sampler(GREEDY),
            processors=make_request_processors(GREEDY, (), len(prompt), failures),
            max_tokens=tokens, stop_tokens=frozenset(), prefill_step_size=512,
        )
        n, first = 0, 0.0
        while True:
            response = seq.step()
            if response is None:
                continue
            n += 1
            if n == 1:
                first = time.perf_counter()
            if response.finish_reason is not None:
                break
        rates.append((n - 1) / (time.perf_counter() - first))
    return rates[1:]


def worker(model_path: Path, prompt: list[int], tokens: int, repeats: int) -> list[float]:
    """The engine's Worker on its own thread; this thread submits and waits on deliveries."""
    import queue

    deliveries: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
    ready = threading.Event()
    w = Worker(EngineConfig(model_path, max_concurrency=32), deliveries.put, lambda *_: ready.set(), lambda _: None)
    thread = threading.Thread(target=w.run)
    thread.start()
    ready.wait()
    rates = []
    request = GenerationRequest(prompt, max_tokens=tokens, sampling=GREEDY, ignore_eos=True)
    for r in range(repeats + 1):
        w.submit(r, request)
        n, first, done = 0, 0.0, False
        while not done:
            d = deliveries.get()
            for _, event in d.events:
                if event.token_id is not None or event.is_final:
                    n += 1
                    if n == 1:
                        first = time.perf_counter()
                done = done or event.is_final
        rates.append((n - 1) / (time.perf_counter() - first))
    w.stop()
    thread.join()
    return rates[1:]


async def engine(model_path: Path, prompt: list[int], tokens: int, repeats: int) -> list[float]:
    rates = []
    request = GenerationRequest(prompt, max_tokens=tokens, sampling=GREEDY, ignore_eos=True)
    async with open_engine(EngineConfig(model_path, max_concurrency=32)) as eng:
        for _ in range(repeats + 1):
            n, first = 0, 0.0
            async with eng.generate(request) as stream:
                async for event in stream:
                    if event.token_id is None and not event.is_final:
                        continue
                    n += 1
                    if n == 1:
                        first = time.perf_counter()
            rates.append((n - 1) / (time.perf_counter() - first))
    return rates[1:]


class PhaseTimer:
    """Wall time spent in a few Worker methods, per engine step (wraps them in place)."""

    PHASES = ("_step", "_solo_step", "_emit_token", "_flush", "_take_commands", "_apply", "_detach_removed")

    def __init__(self) -> None:
        self.totals = dict.fromkeys(self.PHASES, 0.0)
        self._originals: dict[str, Any] = {}

    def __enter__(self) -> PhaseTimer:
        for name in self.PHASES:
            original = getattr(Worker, name)
            self._originals[name] = original

            def timed(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.totals[_name] += time.perf_counter() - start

            setattr(Worker, name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(Worker, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="bench/results/single-stream-probe.json")
    args = parser.parse_args()
    from mlx_lm.utils import load

    path = Path(args.model)
    prompt = [10 + (i * 37) % 3000 for i in range(args.prompt_tokens)]
    model, _ = load(str(path))
    results: dict[str, float] = {}
    results["raw-main"] = statistics.median(raw(model, prompt, args.tokens, args.repeats))
    results["raw-thread"] = statistics.median(on_thread(lambda: raw(model, prompt, args.tokens, args.repeats)))
    results["solo-thread"] = statistics.median(on_thread(lambda: solo(model, prompt, args.tokens, args.repeats)))
    del model
    mx.clear_cache()
    results["worker"] = statistics.median(worker(path, prompt, args.tokens, args.repeats))
    results["engine"] = statistics.median(trio.run(engine, path, prompt, args.tokens, args.repeats))
    timer = PhaseTimer()
    with timer:
        results["engine (timed)"] = statistics.median(trio.run(engine, path, prompt, args.tokens, 1))
    steps = 2 * (args.tokens + 2)
    phases = {k: 1000 * v / steps for k, v in timer.totals.items()}
    results["raw-main (again)"] = statistics.median(raw(load(str(path))[0], prompt, args.tokens, args.repeats))
    print(f"\nsingle-stream probe: {path.name} on {mx.default_device()} ({platform.node()})")
    base = results["raw-main"]
    for key, value in results.items():
        print(f"  {key:<18} {value:9.1f} tok/s  {value / base:5.2f}x")
    print("  engine phases, ms per step (nested: _step holds _solo_step and _emit_token):")
    for key, value in phases.items():
        print(f"    {key:<16} {value:7.3f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"model": str(path), "device": str(mx.default_device()), "tps": results, "phases_ms_per_step": phases}, indent=2))
    mx.synchronize()
    mx.clear_streams()


if __name__ == "__main__":
    main()
