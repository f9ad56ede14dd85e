"""What a never-seen prefill shape costs on MLX's backend, and what the switches change.

MLX's CUDA backend builds a cuDNN attention graph per (query length, key length) for prefill
(docs/architecture.md, "Shape compiles"); `MLX_CUDA_USE_CUDNN_SDPA=0` sends prefill
attention to MLX's composed fallback (matmuls and a softmax) instead. Each configuration
runs in its own process (MLX reads the switches once) on the same random-weight model and
times, per case, the first call of a shape and the same shape again:

- `novel_L`: batch-1 prefill of lengths never seen (and the same length again);
- `chunk_after_prefix`: a 64-token chunk after a prefix of a never-seen length;
- `batch8_novel_L`: a batch of 8 prompts of a never-seen length;
- `chunk512_kv4096`: a 512-token chunk after a 3,584-token prefix (steady cost of long prompts);
- `decode_b8`: one decode step of a batch of 8 at a ~600-token context.

Usage (on the GPU machine): `python bench/shape_compiles.py --out shape_compiles.json`.
`--small` uses a two-layer model with small dimensions (a check that the script runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "no_cudnn_sdpa": {"MLX_CUDA_USE_CUDNN_SDPA": "0"},
    "no_cudnn_sdpa_no_graphs": {"MLX_CUDA_USE_CUDNN_SDPA": "0", "MLX_USE_CUDA_GRAPHS": "0"},
}

LLAMA_8B: dict[str, Any] = {  # a config.json's fields
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}
SMALL = {**LLAMA_8B, "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512}
SMALL.update(num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)


def measure(small: bool) -> dict[str, Any]:
    """In this process: build the model, time each case (ms)."""
    import mlx.core as mx
    from mlx_lm.models import llama
    from mlx_lm.models.cache import make_prompt_cache

    config = SMALL if small else LLAMA_8B
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    vocab: int = config["vocab_size"]
    tokens = iter(range(1, 1 << 30))

    def ids(batch: int, length: int) -> mx.array:
        start = next(tokens) * 7919 % (vocab - length - 1)
        return (mx.arange(batch * length).reshape(batch, length) + start) % vocab

    def timed(fn: Any) -> float:
        mx.synchronize()
        start = time.perf_counter()
        fn()
        mx.synchronize()
        return 1000 * (time.perf_counter() - start)

    def prefill(batch: int, length: int, cache: Any = None) -> Any:
        cache = cache if cache is not None else make_prompt_cache(model)
        mx.eval(model(ids(batch, length), cache=cache), [c.state for c in cache])
        return cache

    def first_and_again(run: Any, shapes: list[Any]) -> dict[str, list[float]]:
        first = [timed(lambda s=s: run(s)) for s in shapes]
        again = [timed(lambda s=s: run(s)) for s in shapes]
        return {"first_ms": first, "again_ms": again}

    def chunk_after(prefix: int) -> None:
        cache = prefill(1, prefix)
        mx.eval(model(ids(1, 64), cache=cache))

    def chunk_after_timed_part(prefix: int) -> float:
        cache = prefill(1, prefix)
        return timed(lambda: mx.eval(model(ids(1, 64), cache=cache)))

    prefill(1, 16)  # load kernels common to every shape
    results: dict[str, Any] = {}
    results["novel_L"] = first_and_again(lambda n: prefill(1, n), [300, 301, 302, 303, 304])
    results["novel_L_long"] = first_and_again(lambda n: prefill(1, n), [1000, 1001, 1002])
    firsts = [chunk_after_timed_part(p) for p in (700, 701, 702, 703, 704)]
    agains = [chunk_after_timed_part(p) for p in (700, 701, 702, 703, 704)]
    results["chunk_after_prefix"] = {"first_ms": firsts, "again_ms": agains}
    results["batch8_novel_L"] = first_and_again(lambda n: prefill(8, n), [400, 401, 402])

    def long_chunk() -> float:
        cache = make_prompt_cache(model)
        for _ in range(7):
            prefill(1, 512, cache)
        return timed(lambda: mx.eval(model(ids(1, 512), cache=cache)))

    results["chunk512_kv4096"] = {"ms": [long_chunk() for _ in range(3)]}

    def decode_steps() -> list[float]:
        cache = prefill(8, 600)
        token = ids(8, 1)
        times = []
        for _ in range(20):
            times.append(timed(lambda: mx.eval(model(token, cache=cache))))
        return times[5:]

    results["decode_b8"] = {"ms": decode_steps()}
    results["device"] = str(mx.default_device())
    return results


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case, value in results.items():
        if not isinstance(value, dict):
            continue
        out[case] = {key: round(statistics.median(ms), 2) for key, ms in value.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--out", default="shape_compiles.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.small)))
        return
    report: dict[str, Any] = {
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
        "model": "llama-3.1-8b shapes, random bf16" if not args.small else "small",
        "configs": {},
    }
    for name in args.configs:
        env = {**os.environ, **CONFIGS[name]}
        command = [
            sys.executable,
            "-P",
            __file__,
            "--child",
            name,
            *(["--small"] if args.small else []),
        ]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            report["configs"][name] = {"error": done.stderr[-2000:]}
            print(name, "failed:", done.stderr[-2000:], file=sys.stderr)
            continue
        raw = json.loads(done.stdout.strip().splitlines()[-1])
        report["configs"][name] = {
            "env": CONFIGS[name],
            "seconds": round(time.perf_counter() - started, 1),
            "median": summarize(raw),
            "raw": raw,
        }
        print(name, json.dumps(report["configs"][name]["median"]), flush=True)
    with open(args.out, "w") as out:
        json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
