"""How far ahead of the device the engine thread should run: a busy batch's decode steps
with prefill chunks among them, read one step behind or more.

The served step at 32 clients is bound by the engine thread, yet the thread also waits:
a prefill chunk every few steps keeps the device busy in one lump, and a thread that reads
each step's tokens right after launching the next waits that lump out, after which the
device waits for the thread's Python. This probe isolates that shape on the engine's own
batch (its `BatchStepper`, fused projections, ragged cache and kernels): `--rows` rows
decoding, every `--chunk-every` steps a `--chunk`-token prefill forward launched after the
decode step (as the engine launches one apart), and `--host-ms` of Python a step standing
for what the engine does beside the model (posting tokens, settling, the HTTP side's GIL).
Each step's tokens are read once `--depth` more steps have been launched after it (0: at
once, before the next step is built; 1: the engine's way, as mlx-lm's `GenerationBatch`
reads them after launching the next). "launch" is the time in `mx.async_eval` alone.

MLX stops launching while more than ten command buffers are in flight; with CUDA graphs
off a buffer holds `MLX_MAX_OPS_PER_BUFFER` kernels, so how far ahead a thread may run also
depends on it: run a variant per process with the variable set (`--ops` does that).

Usage:
  python -P bench/run_ahead.py --preset tiny --layers 8 --rows 8 --steps 24        # CPU
  python -P bench/run_ahead.py --model /tmp/l8b --depth 1 2 3 --ops 100 300 \\
      --host-ms 0 6 --out run-ahead.json                                         # GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing


def spin(ms: float) -> None:
    """Hold the GIL for `ms`, as the engine thread's own Python does."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    import mlx.core as mx

    from mlx_nursery.engine import SamplingParams
    from mlx_nursery.engine._decode_attention import install
    from mlx_nursery.engine._sampling import make_request_sampler, sample_batch
    from mlx_nursery.engine._stepper import BatchStepper, Start
    from mlx_nursery.engine._upstream import make_prompt_cache
    from mlx_nursery.models import load_model

    loaded = load_model(args.model)
    model = loaded.model
    assert model is not None, "a text model"
    install(model)
    stepper = BatchStepper(
        model, max_concurrency=args.rows, prefill_batch_size=8, prefill_step_size=2048
    )
    vocab = int(model.args.vocab_size)
    rng = random.Random(0)
    low, high = args.context
    for i in range(args.rows):
        prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(low, high))]
        stepper.insert_row(
            Start(prompt, None, [], 1 << 20),
            sampler=make_request_sampler(SamplingParams(temperature=0.7, seed=i), []),
            processors=[],
            stop_ids=frozenset(),
        )
    generator = stepper._generator
    while len(generator._prompt_batch) or len(generator._generation_batch) < args.rows:
        stepper.step()
    batch = generator._generation_batch
    samplers = [stepper._samplers.by_uid[uid] for uid in batch.uids]
    chunk_tokens = mx.array([[rng.randrange(100, vocab) for _ in range(args.chunk)]])

    def run(steps: int) -> tuple[float, float, float]:
        tokens = batch._next_tokens
        unread: deque[mx.array] = deque()
        launch = wait = 0.0
        start = time.perf_counter()
        for step in range(steps):
            logits = batch.model(tokens[:, None], cache=batch.prompt_cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            tokens = sample_batch(samplers, logprobs)
            tic = time.perf_counter()
            mx.async_eval(tokens)  # type: ignore[no-untyped-call]
            launch += time.perf_counter() - tic
            if args.chunk_every and step % args.chunk_every == 0:
                cache = make_prompt_cache(model)
                hidden = model.model(chunk_tokens, cache=cache)
                tic = time.perf_counter()
                mx.async_eval(hidden, [c.state for c in cache])  # type: ignore[no-untyped-call]
                launch += time.perf_counter() - tic
            unread.append(tokens)
            tic = time.perf_counter()
            if len(unread) > args.depth:  # the step launched `depth` steps ago
                unread.popleft().tolist()
            wait += time.perf_counter() - tic
            spin(args.host_ms)
        while unread:
            unread.popleft().tolist()
        return time.perf_counter() - start, launch, wait

    run(args.warmup)
    wall, launch, wait = run(args.steps)
    per_step = 1000 / args.steps
    return {
        "depth": args.depth,
        "ops_per_buffer": os.environ.get("MLX_MAX_OPS_PER_BUFFER", "default"),
        "host_ms": args.host_ms,
        "ms_per_step": round(wall * per_step, 2),
        "launch_ms": round(launch * per_step, 2),
        "read_ms": round(wait * per_step, 2),
        "tok_per_s": round(args.rows * args.steps / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path)
    source.add_argument("--preset")
    parser.add_argument("--layers", type=int, help="with --preset: this many layers")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument(
        "--context", type=lambda t: tuple(int(x) for x in t.split(":")), default=(500, 1000)
    )
    parser.add_argument("--chunk", type=int, default=512, help="prefill tokens a chunk")
    parser.add_argument("--chunk-every", type=int, default=3, help="steps (0: no chunks)")
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--depth", type=int, nargs="+", default=[1, 2])  # steps behind
    parser.add_argument("--ops", nargs="+", default=["default"], help="MLX_MAX_OPS_PER_BUFFER")
    parser.add_argument("--host-ms", type=float, nargs="+", default=[0.0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.one:  # a variant, in a process of its own
        args.depth, args.host_ms = args.depth[0], args.host_ms[0]
        print(json.dumps(run_one(args)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        if args.model is None:
            from batch_step import _make

            args.model = _make(Path(scratch) / "model", args.preset, args.layers)
        results = []
        for _, ops, depth, host_ms in itertools.product(
            range(args.rounds), args.ops, args.depth, args.host_ms
        ):
            env = dict(os.environ)
            if ops != "default":
                env["MLX_MAX_OPS_PER_BUFFER"] = ops
            command = [sys.executable, "-P", __file__, "--one", "--model", str(args.model)]
            command += ["--rows", str(args.rows), "--context", "{}:{}".format(*args.context)]
            command += ["--chunk", str(args.chunk), "--chunk-every", str(args.chunk_every)]
            command += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
            command += ["--depth", str(depth), "--host-ms", str(host_ms)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                results.append({"ops": ops, "depth": depth, "error": done.stderr[-2000:]})
            else:
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
            if args.out is not None:  # after each variant: a run cut short keeps what it has
                report = {"args": vars(args) | {"model": str(args.model)}, "results": results}
                args.out.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
