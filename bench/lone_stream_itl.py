"""Where does a lone stream lose time? The median time between tokens, eight ways, in rounds.

  raw-main         mlx-lm's generate_step on the main thread (bench/engine.py's reference)
  raw-thread       the same loop on a long-lived second thread, as the engine has one
  engine           the whole engine, tokens stamped as they reach Trio
  engine-cold      the whole engine on a new prompt each time: no prefix-cache hit (every
                   other engine way repeats one prompt, so its KV cache comes from a hit)
  engine-post-now  the engine, each token posted to Trio as soon as it is read, rather than
                   at the next launch (Worker._post_at_launch off: the engine until 2026-11-22)
  fast-path-bare   the engine's fast path stepped in a bare loop on the engine's own thread:
                   no worker loop between steps, nothing posted to Trio until the end
  fast-path-bare-wake  the same, waking the Trio thread for nothing (run_sync_soon of a no-op)
                   just before each launch, as the engine's post does: what the wake costs
  fast-path-bare-send  the same, with one send on a socket nobody waits on before each
                   launch: the wake's syscall without a thread to wake
  raw-engine-thread    generate_step on the engine's thread, with the engine's model
  fast-path-raw-thread the fast path (`SoloSequence`) on raw-thread's thread, with its model
                   (the last two cross the loop with the thread, and the model loaded there)

Each round runs the chosen ways on one prompt, in alternating order; the table gives the median
over rounds of each round's median inter-token time (the first two and last two gaps left
out) and its ratio to raw-main, the median over rounds of each round's rate ratio to
raw-main (first token to last: slow tokens count), and the 99th percentile of every gap. Inter-token time, unlike a token rate, is not moved by one
slow step, so rounds taken seconds apart on a noisy host compare steady states. For the two
engine ways it also gives the median wait from a token's post on the engine thread to its
delivery starting on the Trio thread: that wait is the Trio thread waiting for the GIL.

Usage: python bench/lone_stream_itl.py --model DIR [--tokens 128] [--rounds 12] [--ways a,b]
Writes JSON (bench/results/lone-stream-itl.json by default). `fast-path-bare` and the
post-to-delivery stamps wrap private Worker and Engine methods, as bench/engine.py's cancel
diagnostics do: a benchmark's probe.
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)  # bench/http.py would shadow the standard library's http package

import argparse
import contextlib
import itertools
import json
import platform
import queue
import random
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import trio

from mlx_nursery.cli import release_mlx_streams
from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine

GREEDY = SamplingParams(temperature=0.0)
WAYS = ("raw-main", "raw-thread", "engine", "engine-cold", "engine-post-now", "fast-path-bare",
        "fast-path-bare-wake", "fast-path-bare-send", "raw-engine-thread", "fast-path-raw-thread")
POSTING_WAYS = ("engine", "engine-post-now")


def raw_stamps(model: Any, prompt: list[int], tokens: int) -> list[float]:
    from mlx_lm.generate import generate_step

    return [time.perf_counter() for _ in generate_step(mx.array(prompt), model, max_tokens=tokens)]


def median_gap_ms(stamps: list[float]) -> float:
    gaps = [b - a for a, b in itertools.pairwise(stamps)][2:-2]
    return 1000 * statistics.median(gaps)


def fast_path_stamps(model: Any, prompt: list[int], tokens: int) -> list[float]:
    """The engine's `SoloSequence`, stepped bare, as the engine would for a greedy request."""
    from mlx_lm.sample_utils import greedy_sampler

    from mlx_nursery.engine._solo import SoloSequence

    solo = SoloSequence(model, -1, prompt, cache=None, cached_tokens=0, sampler=greedy_sampler,
                        processors=[], max_tokens=tokens, stop_tokens=frozenset(),
                        prefill_step_size=2048)
    stamps = []
    while True:
        response = solo.step()
        if response is not None:
            stamps.append(time.perf_counter())
            if response.finish_reason is not None:
                return stamps


class RawThread:
    """One long-lived thread that runs a loop (raw or fast path) on its own model on request."""

    def __init__(self, model: Any, prompt: list[int], tokens: int) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[list[float]] = queue.SimpleQueue()
        self._args = (model, prompt, tokens)
        self._thread = threading.Thread(target=self._serve)
        self._thread.start()

    def _serve(self) -> None:
        while (loop := self._jobs.get()) is not None:
            self._results.put(loop(*self._args))
        mx.synchronize()
        mx.clear_streams()  # this thread made MLX streams (ml-explore/mlx#4327)

    def run(self, loop: Any = raw_stamps) -> list[float]:
        self._jobs.put(loop)
        return self._results.get()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


class BareFastPath:
    """While armed, the engine's next lone sequence is stepped to its end in one call."""

    def __init__(self, engine: Engine) -> None:
        worker = engine._worker  # a benchmark's probe
        assert worker is not None
        self.armed = False
        self.raw: tuple[list[int], int] | None = None
        """Set with `armed`: run generate_step (prompt, tokens) on the engine's model instead;
        the engine's own sequence then runs as usual."""
        self.stamps: list[float] = []
        self.before_launch: Any = None
        """Set with `armed`: run before each launch instead of the worker's post."""
        step = worker._solo_step

        def bare() -> list[Any]:
            if not self.armed or worker._solo is None or worker._solo.solo is None:
                return step()
            if self.raw is not None:
                assert worker._model is not None
                self.stamps = raw_stamps(worker._model.model, *self.raw)
                self.armed = False
                return step()
            solo = worker._solo.solo
            if self.before_launch is not None:
                solo._before_launch = self.before_launch
            while True:
                response = solo.step()
                if response is not None:
                    self.stamps.append(time.perf_counter())
                    if response.finish_reason is not None:
                        return [response]

        worker._solo_step = bare  # type: ignore[method-assign]


class PostToDelivery:
    """Stamps each delivery's post (engine thread) and the start of its handling (Trio)."""

    def __init__(self, engine: Engine) -> None:
        worker = engine._worker  # a benchmark's probe
        assert worker is not None
        self.waits: list[float] = []
        posted: list[float] = []
        post, deliver = worker._post, engine._deliver

        def stamped_post(delivery: Any) -> None:
            posted.append(time.perf_counter())
            post(delivery)

        def stamped_deliver(delivery: Any) -> None:
            if posted:
                self.waits.append(time.perf_counter() - posted.pop(0))
            deliver(delivery)

        worker._post = stamped_post  # type: ignore[method-assign]
        engine._deliver = stamped_deliver  # type: ignore[method-assign]


async def engine_stamps(engine: Engine, request: GenerationRequest) -> list[float]:
    stamps = []
    async with engine.generate(request) as stream:
        async for event in stream:
            if event.token_id is not None:
                stamps.append(time.perf_counter())
    return stamps


@attrs.define
class Measured:
    gaps: dict[str, list[float]]
    """Each round's median time between tokens, ms."""
    rates: dict[str, list[float]]
    """Each round's rate from the first token to the last, tok/s: slow tokens included."""
    every_gap: dict[str, list[float]]
    """Every time between tokens (the second token's left out), ms, for the tail."""
    waits: dict[str, list[float]]


async def measure(model_path: Path, tokens: int, rounds: int, chosen: tuple[str, ...]) -> Measured:
    from mlx_lm.utils import load

    prompt, rng, vocab = lone_prompt(model_path)
    request = GenerationRequest(prompt, max_tokens=tokens, sampling=GREEDY, ignore_eos=True)

    def cold_request() -> GenerationRequest:
        fresh = [rng.randrange(10, min(vocab, 4000)) for _ in range(len(prompt))]
        return GenerationRequest(fresh, max_tokens=tokens, sampling=GREEDY, ignore_eos=True)
    model = load(str(model_path))[0]
    other = RawThread(model, prompt, tokens)
    unread, unwatched = socket.socketpair()  # for fast-path-bare-send: nobody waits on `unread`
    unread.setblocking(False)
    unwatched.setblocking(False)
    measured = Measured({w: [] for w in chosen}, {w: [] for w in chosen}, {w: [] for w in chosen},
                        {w: [] for w in POSTING_WAYS if w in chosen})
    gaps, waits = measured.gaps, measured.waits
    try:
        async with open_engine(EngineConfig(model_path, max_concurrency=32)) as engine:
            bare = BareFastPath(engine)
            stamps = PostToDelivery(engine)
            worker = engine._worker
            assert worker is not None

            async def posting_stamps(*, at_launch: bool) -> list[float]:
                worker._post_at_launch, stamps.waits = at_launch, []
                try:
                    return await engine_stamps(engine, request)
                finally:
                    worker._post_at_launch = True

            async def bare_stamps(*, raw: bool = False, before_launch: Any = None) -> list[float]:
                bare.armed, bare.stamps, bare.raw = True, [], (prompt, tokens) if raw else None
                bare.before_launch = before_launch
                try:
                    await engine_stamps(engine, request)
                finally:
                    bare.armed, bare.raw, bare.before_launch = False, None, None
                return bare.stamps

            trio_token = trio.lowlevel.current_trio_token()
            sends = itertools.count(1)

            def wake_trio() -> None:
                trio_token.run_sync_soon(lambda: None)

            def send_unwatched() -> None:
                with contextlib.suppress(BlockingIOError):  # as Trio's wake-up sends
                    unwatched.send(b"\0")
                if next(sends) % 256 == 0:  # keep the buffer from filling, rarely
                    with contextlib.suppress(BlockingIOError):
                        unread.recv(65536)

            ways = {
                "raw-main": lambda: _ready(raw_stamps(model, prompt, tokens)),
                "raw-thread": lambda: _ready(other.run()),
                "engine": lambda: posting_stamps(at_launch=True),
                "engine-cold": lambda: engine_stamps(engine, cold_request()),
                "engine-post-now": lambda: posting_stamps(at_launch=False),
                "fast-path-bare": bare_stamps,
                "fast-path-bare-wake": lambda: bare_stamps(before_launch=wake_trio),
                "fast-path-bare-send": lambda: bare_stamps(before_launch=send_unwatched),
                "raw-engine-thread": lambda: bare_stamps(raw=True),
                "fast-path-raw-thread": lambda: _ready(other.run(fast_path_stamps)),
            }
            for way in chosen:  # warm-up: kernels compiled, caches filled
                await ways[way]()
            for r in range(rounds):
                for way in chosen if r % 2 == 0 else reversed(chosen):
                    stamped = await ways[way]()
                    gaps[way].append(median_gap_ms(stamped))
                    measured.rates[way].append((len(stamped) - 1) / (stamped[-1] - stamped[0]))
                    measured.every_gap[way] += [1000 * (b - a) for a, b in itertools.pairwise(stamped)][1:]
                    if way in waits:
                        waits[way].append(1000 * statistics.median(stamps.waits))
                print(f"round {r}: " + ", ".join(f"{w} {gaps[w][-1]:.2f} ms" for w in chosen), flush=True)
    finally:
        other.close()
        unread.close()
        unwatched.close()
    return measured


async def _ready(value: list[float]) -> list[float]:
    return value


def lone_prompt(model_path: Path) -> tuple[list[int], random.Random, int]:
    """The 128-token prompt every way runs, the generator that made it, and the vocab size."""
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    rng = random.Random(1)
    return [rng.randrange(10, min(vocab, 4000)) for _ in range(128)], rng, vocab


def arguments(doc: str | None, json_default: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--json", default=json_default)
    return parser


def write_results(args: argparse.Namespace, **results: Any) -> None:
    """Write `results` as JSON to `--json`, with the run's model, device, machine and date."""
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "model": args.model, "device": str(mx.default_device()), "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d"), "tokens": args.tokens, "rounds": args.rounds,
        **results,
    }, indent=2))
    print(f"\nwrote {out}")


def main() -> None:
    parser = arguments(__doc__, "bench/results/lone-stream-itl.json")
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated; raw-main is always run")
    args = parser.parse_args()
    chosen = tuple(dict.fromkeys(["raw-main", *args.ways.split(",")]))
    unknown = [way for way in chosen if way not in WAYS]
    if unknown:
        parser.error(f"unknown ways: {', '.join(unknown)}; choose from {', '.join(WAYS)}")
    measured = trio.run(measure, Path(args.model), args.tokens, args.rounds, chosen)
    gaps, waits = measured.gaps, measured.waits
    medians = {way: statistics.median(values) for way, values in gaps.items()}
    wait_medians = {way: statistics.median(values) for way, values in waits.items()}
    raw_rates = measured.rates["raw-main"]
    rate_ratios = {way: statistics.median(r / raw for r, raw in zip(rates, raw_rates, strict=True))
                   for way, rates in measured.rates.items()}
    p99 = {way: sorted(values)[int(0.99 * (len(values) - 1))] for way, values in measured.every_gap.items()}
    print(f"\nlone stream: {args.model} on {mx.default_device()}")
    print(f"  {'way':<20} {'median gap':>10} {'x raw':>6} {'rate x raw':>10} {'p99 gap':>8}")
    for way in gaps:
        line = (f"  {way:<20} {medians[way]:7.3f} ms {medians['raw-main'] / medians[way]:6.2f}"
                f" {rate_ratios[way]:10.2f} {p99[way]:5.1f} ms")
        if way in wait_medians:
            line += f"  post -> delivery {wait_medians[way]:.3f} ms"
        print(line)
    write_results(
        args, median_gap_ms=medians, rounds_gap_ms=gaps,
        rate_vs_raw_main=rate_ratios, rounds_rate_tps=measured.rates, p99_gap_ms=p99,
        median_post_to_delivery_ms=wait_medians, rounds_post_to_delivery_ms=waits,
    )
    release_mlx_streams()


if __name__ == "__main__":
    main()
