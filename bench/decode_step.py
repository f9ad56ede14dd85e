"""The bare decode step, no engine around it: fused projections (models/_fusing.py) against
the checkpoint's layout, cuDNN attention on and off, MLP blocks compiled (`mx.compile`).

Each configuration runs in its own process (MLX reads `MLX_CUDA_USE_CUDNN_SDPA` once per
process), on the same model directory. Per batch size: that many rows of `--context` random
tokens are prefilled into mlx-lm's KV caches, then `--steps` greedy decode steps run
pipelined as mlx-lm's `generate_step` runs them (step N+1 is built and launched before
step N's tokens are read). Per step, medians over the steps after the first two:
  - build: the model call and the argmax returning lazy arrays (Python, graph building);
  - launch: `mx.async_eval` of them (MLX encoding and launching the kernels);
  - host: build + launch, what the host spends to keep the device fed;
  - wall: one step of the pipelined loop; tok/s is the batch over the mean wall time.
`first_ms` is the first step's wall time (a compiled block's trace and compile, kernels
built on first use). The other variants are fed the unfused run's tokens (same cuDNN
setting): `same_tokens` says whether their greedy choice agreed at every step, and
`max_dlogprob` is the largest difference of the log-probability given to the unfused run's
token (random bf16 weights tie often: compare the log-probabilities for the numerics).

Usage:
  python -P bench/decode_step.py --preset small --batches 1 8 --steps 64          # CPU
  python -P bench/decode_step.py --model /tmp/l8b --batches 1 8 32 --cudnn off on \\
      --out decode_step.json                                                       # GPU
`--preset` makes the model (random weights) in a temporary directory first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("unfused", "fused", "fused+compiled")


def _compile_mlps(model: Any) -> int:
    """Each layer's MLP block through `mx.compile` (the fused gate/up inside it)."""
    import mlx.core as mx
    from mlx.nn.layers.base import Module

    class CompiledMLP(Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()  # type: ignore[no-untyped-call]  # mlx leaves it unannotated
            self.inner = inner
            self._call = mx.compile(inner.__call__)

        def __call__(self, x: Any) -> Any:
            return self._call(x)

    count = 0
    for layer in model.layers:
        if hasattr(layer, "mlp"):
            layer.mlp = CompiledMLP(layer.mlp)
            count += 1
    return count


def child(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "1" if spec["cudnn"] else "0"
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_nursery.models import load_model

    variant = spec["variant"]
    loaded = load_model(spec["model"], fuse_weights=variant != "unfused")
    model, vocab = loaded.model, loaded.vocab_size
    assert model is not None, "a text model"
    compiled = _compile_mlps(model) if variant == "fused+compiled" else 0
    results = []
    for batch in spec["batches"]:
        mx.random.seed(batch)
        prompt = mx.random.randint(10, min(vocab, 4000), (batch, spec["context"]))
        cache = make_prompt_cache(model)
        for start in range(0, spec["context"], 512):
            model(prompt[:, start : start + 512], cache=cache)
            mx.eval([c.state for c in cache])
        y = prompt[:, -1:]
        baseline = [mx.array(t) for t in spec.get("baseline", {}).get(str(batch), [])]
        builds, launches, walls, tokens, chosen = [], [], [], [], []
        previous: Any = None
        for step in range(spec["steps"] + 1):
            t0 = time.perf_counter()
            logits = model(y, cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            nxt = mx.argmax(logprobs, axis=-1)
            forced = baseline[step] if step < len(baseline) else nxt
            picked = mx.take_along_axis(logprobs, forced[:, None], axis=-1)[:, 0]
            t1 = time.perf_counter()
            mx.async_eval(nxt, picked)  # type: ignore[no-untyped-call]  # as above
            t2 = time.perf_counter()
            if previous is not None:
                tokens.append(previous[0].tolist())
                chosen.append(previous[1].astype(mx.float32).tolist())
            t3 = time.perf_counter()
            builds.append(t1 - t0)
            launches.append(t2 - t1)
            walls.append(t3 - t0)
            previous = (nxt, picked)
            y = forced[:, None]
        steady = slice(2, None)
        wall_mean = statistics.mean(walls[steady])
        results.append(
            {
                "batch": batch,
                "build_ms": 1e3 * statistics.median(builds[steady]),
                "launch_ms": 1e3 * statistics.median(launches[steady]),
                "host_ms": 1e3
                * statistics.median([b + c for b, c in zip(builds, launches, strict=True)][steady]),
                "wall_ms": 1e3 * statistics.median(walls[steady]),
                "tok_s": batch / wall_mean,
                "first_ms": 1e3 * walls[0],
                "tokens": tokens,
                "chosen_logprobs": chosen,
            }
        )
        del cache
        mx.clear_cache()
    return {
        "variant": variant,
        "cudnn": spec["cudnn"],
        "compiled_blocks": compiled,
        "rows": results,
    }


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-P", __file__, "--child", json.dumps(spec)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def compare(result: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Each row's tokens and teacher-forced log-probabilities against the unfused run's."""
    base = {row["batch"]: row for row in baseline["rows"]}
    for row in result["rows"]:
        ref = base[row["batch"]]
        row["same_tokens"] = row["tokens"] == ref["tokens"]
        row["max_dlogprob"] = max(
            abs(a - b)
            for got, want in zip(row["chosen_logprobs"], ref["chosen_logprobs"], strict=True)
            for a, b in zip(got, want, strict=True)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", help="a model directory")
    source.add_argument("--preset", help="make this preset (random weights) first")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--cudnn", nargs="+", choices=("off", "on"), default=["off"])
    parser.add_argument("--rounds", type=int, default=1, help="each configuration, alternating")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if not (args.model or args.preset):
        parser.error("give --model or --preset")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if args.preset:
            from mlx_nursery.tools import make_model

            model = str(make_model(Path(tmp) / args.preset, args.preset, dtype=args.dtype))
        report = measure(args, model)
    print_table(report["results"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


def measure(args: argparse.Namespace, model: str) -> dict[str, Any]:
    common = {"model": model, "batches": args.batches, "context": args.context}
    common["steps"] = args.steps
    results = []
    for round_ in range(args.rounds):
        for cudnn in args.cudnn:
            spec = {**common, "cudnn": cudnn == "on"}
            order = list(args.variants) if round_ % 2 == 0 else list(reversed(args.variants))
            unfused = run_child({**spec, "variant": "unfused"})
            forced = {str(r["batch"]): r["tokens"] for r in unfused["rows"]}
            for variant in order:
                result = unfused if variant == "unfused" else None
                if result is None:
                    result = run_child({**spec, "variant": variant, "baseline": forced})
                compare(result, unfused)
                result["round"] = round_
                results.append(result)
    for result in results:
        for row in result["rows"]:
            row.pop("tokens"), row.pop("chosen_logprobs")
    import mlx.core as mx

    return {
        "machine": {"platform": platform.platform(), "device": mx.device_info()},
        "args": vars(args),
        "results": results,
    }


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        f"{'variant':16} {'cudnn':5} {'B':>3} {'build':>7} {'launch':>7} {'host':>7} "
        f"{'wall':>7} {'tok/s':>8} {'first':>8} same  dlogprob"
    )
    for result in results:
        for row in result["rows"]:
            print(
                f"{result['variant']:16} {'on' if result['cudnn'] else 'off':5} "
                f"{row['batch']:>3} {row['build_ms']:7.2f} {row['launch_ms']:7.2f} "
                f"{row['host_ms']:7.2f} {row['wall_ms']:7.2f} {row['tok_s']:8.1f} "
                f"{row['first_ms']:8.1f} {row['same_tokens']!s:5} {row['max_dlogprob']:.4f}"
            )


if __name__ == "__main__":
    main()
