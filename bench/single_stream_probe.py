"""Where does a lone stream lose time? Decode tok/s of the same greedy stream, layer by layer.

  raw-main     mlx_lm generate_step on the main thread (the benchmark's reference)
  solo-thread  our SoloSequence stepped in a loop on a worker thread; variants: a
               BatchGenerator made first, each response dropped at once, a second thread
               woken per token, the model loaded on that thread
  worker       the engine's Worker on its thread, no Trio; variants: this thread not woken
               per step, step responses kept one more step (the variant that found the
               cost of dropping them early; the Worker now keeps them itself), GC off,
               no wired-limit call
  engine       the whole engine, consumed from Trio (and once with per-phase timers)

Usage: python bench/single_stream_probe.py --model DIR [--tokens 256] [--repeats 3]
Prints a table and writes JSON (bench/results/single-stream-probe.json by default).
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)  # bench/http.py would shadow the standard library's http package

import argparse
import functools
import json
import platform
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

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


def solo(
    model: Any, prompt: list[int], tokens: int, repeats: int, *,
    prefix_hit: bool = False, waker: bool = False, batch_generator: bool = False,
    drop_response: bool = False,
) -> list[float]:
    """`prefix_hit`: start each run from the prefix cache, as a repeated prompt does in the
    engine. `waker`: hand each token to another Python thread, as the engine hands steps to Trio.
    `batch_generator`: make (and keep) an idle BatchGenerator first, as the Worker does.
    `drop_response`: drop each response as soon as it is read, as the Worker does."""
    import queue

    from mlx_lm.generate import BatchGenerator

    from mlx_nursery.engine import PrefixCache

    if isinstance(model, Path):
        from mlx_lm.utils import load

        model = load(str(model))[0]
    generator = BatchGenerator(model, completion_batch_size=32) if batch_generator else None

    cache = PrefixCache(max_bytes=8 << 30)
    tokens_out: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    def consume() -> None:
        while tokens_out.get() is not None:
            pass

    consumer = threading.Thread(target=consume)
    if waker:
        consumer.start()
    rates = []
    for _ in range(repeats + 1):
        failures: list[BaseException] = []
        hit = cache.fetch("probe", prompt) if prefix_hit else None
        seq = SoloSequence(
            model, -1, prompt, cache=hit.cache if hit else None, cached_tokens=hit.cached_tokens if hit else 0,
            sampler=make_request_sampler(GREEDY),
            processors=make_request_processors(GREEDY, (), len(prompt), failures),
            max_tokens=tokens, stop_tokens=frozenset(), prefill_step_size=512,
        )
        n, first = 0, 0.0
        while True:
            response = seq.step()
            if response is None:
                continue
            if waker:
                tokens_out.put(response.token)
            n += 1
            if n == 1:
                first = time.perf_counter()
            if response.finish_reason is not None:
                break
            if drop_response:
                del response
        rates.append((n - 1) / (time.perf_counter() - first))
        if prefix_hit and response.prompt_cache is not None and response.all_tokens is not None:
            cache.insert("probe", response.all_tokens, response.prompt_cache)
    if waker:
        tokens_out.put(None)
        consumer.join()
    if generator is not None:
        generator.close()
    return rates[1:]


class _Unwoken:
    """Keeps deliveries (stamped on arrival) and wakes the waiting thread only on a final event."""

    def __init__(self) -> None:
        self._kept: list[tuple[float, Delivery]] = []
        self._final = threading.Event()
        self.stamp = 0.0

    def put(self, delivery: Delivery) -> None:
        self._kept.append((time.perf_counter(), delivery))
        if any(event.is_final for _, event in delivery.events):
            self._final.set()

    def get(self) -> Delivery:
        while not self._kept:
            self._final.wait()
            self._final.clear()
        self.stamp, delivery = self._kept.pop(0)
        return delivery


class _Woken:
    """Wakes the waiting thread for every delivery, as the engine wakes Trio."""

    def __init__(self) -> None:
        import queue

        self._queue: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self.stamp = 0.0

    def put(self, delivery: Delivery) -> None:
        self._queue.put(delivery)

    def get(self) -> Delivery:
        delivery = self._queue.get()
        self.stamp = time.perf_counter()
        return delivery


def worker(
    model_path: Path, prompt: list[int], tokens: int, repeats: int, cache_bytes: int = 2 << 30,
    *, woken: bool = True, keep_responses: bool = False, gc_off: bool = False, wired_limit: bool = True,
) -> list[float]:
    import contextlib
    import gc

    generate_module = sys.modules["mlx_lm.generate"]  # `mlx_lm.generate` is also a function

    with contextlib.ExitStack() as undo:
        if keep_responses:
            original_step = Worker._solo_step

            def kept(self: Worker) -> list[Any]:
                responses = original_step(self)
                self.__dict__["_probe_kept"] = responses  # dropped one step later
                return responses

            Worker._solo_step = kept  # type: ignore[method-assign]
            undo.callback(setattr, Worker, "_solo_step", original_step)
        if gc_off:
            gc.disable()
            undo.callback(gc.enable)
        if not wired_limit:
            original_limit = generate_module.maybe_set_recommended_wired_limit
            generate_module.maybe_set_recommended_wired_limit = lambda: None
            undo.callback(setattr, generate_module, "maybe_set_recommended_wired_limit", original_limit)
        return _worker(model_path, prompt, tokens, repeats, cache_bytes, woken=woken)


def _worker(
    model_path: Path, prompt: list[int], tokens: int, repeats: int, cache_bytes: int, *, woken: bool,
) -> list[float]:
    """The engine's Worker on its own thread; this thread submits and waits on deliveries
    (woken for each one, as Trio is, or only for the last)."""
    deliveries: _Woken | _Unwoken = _Woken() if woken else _Unwoken()
    ready = threading.Event()
    w = Worker(EngineConfig(model_path, max_concurrency=32, prompt_cache_bytes=cache_bytes), deliveries.put, lambda *_: ready.set(), lambda _: None)
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
                        first = deliveries.stamp
                done = done or event.is_final
        rates.append((n - 1) / (deliveries.stamp - first))
    w.stop()
    thread.join()
    return rates[1:]


async def engine(
    model_path: Path, prompt: list[int], tokens: int, repeats: int, cache_bytes: int = 2 << 30
) -> list[float]:
    rates = []
    request = GenerationRequest(prompt, max_tokens=tokens, sampling=GREEDY, ignore_eos=True)
    async with open_engine(EngineConfig(model_path, max_concurrency=32, prompt_cache_bytes=cache_bytes)) as eng:
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

    def __enter__(self) -> Self:
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
    solo_variants: dict[str, dict[str, Any]] = {
        "solo-thread": {},
        "solo-thread, BatchGenerator made": {"batch_generator": True},
        "solo-thread, response dropped": {"drop_response": True},
        "solo-thread, waker": {"waker": True},
    }
    for name, options in solo_variants.items():
        results[name] = statistics.median(on_thread(
            functools.partial(solo, model, prompt, args.tokens, args.repeats, **options)))
    results["solo-thread, model loaded there"] = statistics.median(
        on_thread(functools.partial(solo, path, prompt, args.tokens, args.repeats)))
    del model
    mx.clear_cache()
    worker_variants: dict[str, dict[str, Any]] = {
        "worker, not woken": {"woken": False},
        "worker, not woken, responses kept": {"woken": False, "keep_responses": True},
        "worker, not woken, gc off": {"woken": False, "gc_off": True},
        "worker, not woken, no wired limit": {"woken": False, "wired_limit": False},
        "worker": {},
    }
    for name, options in worker_variants.items():
        results[name] = statistics.median(worker(path, prompt, args.tokens, args.repeats, **options))
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
        print(f"  {key:<36} {value:9.1f} tok/s  {value / base:5.2f}x")
    print("  engine phases, ms per step (nested: _step holds _solo_step and _emit_token):")
    for key, value in phases.items():
        print(f"    {key:<16} {value:7.3f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"model": str(path), "device": str(mx.default_device()), "tps": results, "phases_ms_per_step": phases}, indent=2))
    mx.synchronize()
    mx.clear_streams()


if __name__ == "__main__":
    main()
