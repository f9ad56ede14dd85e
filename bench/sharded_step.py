"""Where a tensor-parallel decode step's time goes (issue 33): the bare sharded step, no
server, against the same step on one device, and the step's all-reduces alone.

Run once alone (one device: the whole model) and once under `mlx.launch -n 2` (each rank its
shard, loaded as the server loads it: `distributed._loading.load_shard`). Per batch size:
that many rows of `--context` random tokens are prefilled into mlx-lm's KV caches, then
`--steps` greedy decode steps run pipelined as mlx-lm's `generate_step` runs them (step N+1
built and launched before step N's tokens are read). Reported per step (medians after the
first two steps): host (the model call's graph building plus `mx.async_eval`), wall (one
step of the pipelined loop), tok/s. Distributed, also `collectives`: the step's all-reduces
alone (two a layer, each of the step's activations, `[batch, 1, hidden]`), chained and
pipelined the same way, so that the step's extra cost over one device can be split into
the collectives themselves and the rest (how they are launched, the halved matmuls).
`--kernels`: the largest batch's step under torch.profiler on rank 0, kernels a step by
family and the device's busy time (`_kernels.py`).

Usage:
  python -P bench/sharded_step.py --model DIR --batches 1 8 32 --out one.json
  mlx.launch -n 2 --backend nccl -- python3 -P bench/sharded_step.py --model DIR \\
      --batches 1 8 32 --out tp2.json                       # written by rank 0
On the CPU: `--backend ring` and a float32 preset (`--preset small` makes one first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlx_nursery.distributed._loading import load_shard
from mlx_nursery.engine.stepping import generation_stream
from mlx_nursery.models import load_model
from mlx_nursery.tools import make_model

sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing
from _kernels import profile_steps


def _prefill(model: Any, batch: int, context: int, chunk: int = 512) -> tuple[list[Any], mx.array]:
    cache = make_prompt_cache(model)
    tokens = mx.random.randint(0, 1000, (batch, context), key=mx.random.key(0))
    with mx.stream(generation_stream):
        for start in range(0, context - 1, chunk):
            model(tokens[:, start : min(start + chunk, context - 1)], cache=cache)
            mx.eval([c.state for c in cache])
    return cache, tokens[:, -1:]


def _pipelined(step: Any, first: mx.array, steps: int) -> dict[str, float]:
    """Run `step` (lazy next from previous) pipelined; medians after the first two."""
    host, wall = [], []
    with mx.stream(generation_stream):
        y = step(first)
        # mlx's stub leaves async_eval untyped, hence each call's no-untyped-call ignore
        mx.async_eval(y)  # type: ignore[no-untyped-call]
        for _ in range(steps):
            started = time.perf_counter()
            nxt = step(y)
            mx.async_eval(nxt)  # type: ignore[no-untyped-call]
            launched = time.perf_counter()
            y.tolist() if y.size < 4096 else mx.eval(y)
            wall.append(time.perf_counter() - started)
            host.append(launched - started)
            y = nxt
        mx.eval(y)
    return {
        "host_ms": statistics.median(host[2:]) * 1000,
        "wall_ms": statistics.median(wall[2:]) * 1000,
        "wall_mean_ms": statistics.mean(wall[2:]) * 1000,
    }


def _decode(
    model: Any, batch: int, args: argparse.Namespace, record: Any = None
) -> dict[str, float]:
    cache, last = _prefill(model, batch, args.context)

    def step(y: mx.array) -> mx.array:
        if record is not None:
            record()
        logits = model(y.reshape(batch, 1), cache=cache)[:, -1, :]
        return mx.argmax(logits, axis=-1)

    result = _pipelined(step, last[:, 0], args.steps)
    result["tok_s"] = batch / (result["wall_mean_ms"] / 1000)
    return result


def _kernels(model: Any, batch: int, args: argparse.Namespace, profiled: bool) -> dict[str, Any]:
    """The pipelined decode step's CUDA kernels by family and the device's busy time, on
    this rank (`profiled`; the other ranks run the same steps unprofiled: every step's
    collectives need them all)."""
    cache, last = _prefill(model, batch, args.context)
    y = last[:, 0]

    def step() -> None:
        nonlocal y
        logits = model(y.reshape(batch, 1), cache=cache)[:, -1, :]
        nxt = mx.argmax(logits, axis=-1)
        mx.async_eval(nxt)  # type: ignore[no-untyped-call]
        y.tolist()
        y = nxt

    with mx.stream(generation_stream):
        mx.async_eval(y)  # type: ignore[no-untyped-call]
        for _ in range(4):
            step()
        if profiled:
            return profile_steps(step, 16)
        mx.synchronize()
        for _ in range(16):
            step()
        mx.synchronize()
    return {}


def _records(kind: str, group: Any) -> Any:
    """Each step's record as the server sends it (`distributed/_channel.py`): rank 0 queues a
    4 KiB `all_sum` and goes on; the others wait for it before building their step. "nccl":
    on the step's group and stream (the server's way), so a follower's wait queues behind the
    step in flight; "ring": on a second group of MLX's ring backend, on the CPU stream."""
    frame = np.zeros(4096, np.uint8)
    if kind == "ring":
        base = int(os.environ.get("NCCL_PORT", "12345")) + 100
        hosts = Path(tempfile.gettempdir()) / f"mlx-ring-records-{base}.json"
        hosts.write_text(json.dumps([[f"127.0.0.1:{base + i}"] for i in range(group.size())]))
        os.environ["MLX_HOSTFILE"] = str(hosts)
        group, stream = mx.distributed.init(backend="ring"), mx.cpu
    else:
        stream = generation_stream

    def record() -> None:
        with mx.stream(stream):
            out = mx.distributed.all_sum(mx.array(frame), group=group)
        if group.rank() == 0:
            mx.async_eval(out)  # type: ignore[no-untyped-call]
        else:
            mx.eval(out)

    return record


def _collectives(model: Any, group: Any, batch: int, args: argparse.Namespace) -> dict[str, float]:
    layers = len(model.layers)
    hidden = int(model.args.hidden_size)
    dtype = model.layers[0].self_attn.o_proj.weight.dtype

    def step(x: mx.array) -> mx.array:
        for _ in range(2 * layers):
            x = mx.distributed.all_sum(x, group=group) * 0.5
        return x

    return _pipelined(step, mx.zeros((batch, 1, hidden), dtype), args.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument(
        "--records",
        nargs="+",
        default=["none"],
        choices=["none", "nccl", "ring"],
        help="distributed: also run the decode with each step's record sent first (_records)",
    )
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="the largest batch's step under torch.profiler on rank 0 (the GPU machine)",
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    group = mx.distributed.init()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else make_model(Path(tmp) / "m", args.preset)
        if group.size() > 1:
            model = load_shard(path, "tensor", group).model
        else:
            model = load_model(path, fuse_weights=False).model  # as the shards: unfused
    report: dict[str, Any] = {
        "model": str(path),
        "ranks": group.size(),
        "device": str(mx.default_device()),
        "settings": vars(args),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("MLX_", "NCCL_"))},
        "decode": {},
        "collectives": {},
    }
    records = {k: _records(k, group) for k in args.records if k != "none" and group.size() > 1}
    for batch in args.batches:
        report["decode"][batch] = _decode(model, batch, args)
        for kind, record in records.items():
            report.setdefault(f"decode with {kind} records", {})[batch] = _decode(
                model, batch, args, record
            )
        if group.size() > 1:
            report["collectives"][batch] = _collectives(model, group, batch, args)
    if args.kernels:
        report["kernels"] = _kernels(model, max(args.batches), args, group.rank() == 0)
    if group.rank() == 0:
        text = json.dumps(report, indent=1)
        if args.out:
            Path(args.out).write_text(text)
        print(text)


if __name__ == "__main__":
    main()
