"""CUDA kernels a step launches, by family, and the device's busy time: torch.profiler
(CUPTI), which sees MLX's kernels too; only where torch with CUDA is installed (the GPU
machine). Shared by the step benchmarks."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import mlx.core as mx


def _family(name: str) -> str:
    """A kernel's name without its template arguments' noise: what launched it."""
    name = re.sub(r"^void ", "", name)
    head = re.split(r"[<(]", name, maxsplit=1)[0]
    if head.startswith("mlx::core::cu::"):
        head = head[len("mlx::core::cu::") :]
        if head.startswith(("copy", "binary", "unary", "ternary")):
            dims = re.search(r"<[^,]+,[^,]+,[^,]+, (\d+)", name)
            head += f"/{dims.group(1)}" if dims and head.endswith("_nd") else ""
    if head.startswith("nvjet") or "gemm" in head.lower() or "cublas" in head:
        return "gemm (cuBLAS)"
    return head[:60]


def busy_us(spans: list[tuple[float, float]]) -> float:
    """The time covered by any of `spans` (kernels that overlap count once)."""
    busy, end = 0.0, -1.0
    for a, b in sorted(spans):
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def runtime_calls(
    events: list[Any], lo: float = float("-inf"), hi: float = float("inf")
) -> dict[str, int]:
    """The host's CUDA API calls among torch.profiler's `events` (CUPTI's runtime records:
    buffer allocations, graphs built and updated, kernels launched) that start in [lo, hi),
    by name, the most frequent first."""
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        if (
            e.device_type.name != "CUDA"
            and e.name.startswith("cu")
            and lo <= e.time_range.start < hi
        ):
            counts[e.name] += 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def profile_steps(step: Callable[[], None], steps: int) -> dict[str, Any]:
    """`steps` steps (always run) under torch.profiler: kernels a step by family, device busy,
    and the host's CUDA API calls a step (graphs instantiated or updated, kernels launched)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:  # the steps still run: other ranks' collectives wait for them
        for _ in range(steps):
            step()
        mx.synchronize()
        return {"error": "no torch.profiler"}
    mx.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        mx.synchronize()
    every = list(prof.events())
    events = [e for e in every if e.device_type.name == "CUDA"]
    by_family: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        totals = by_family[_family(e.name)]
        totals[0] += e.time_range.end - e.time_range.start
        totals[1] += 1
    busy = busy_us([(e.time_range.start, e.time_range.end) for e in events])
    return {
        "kernels_per_step": round(len(events) / steps, 1),
        "busy_ms_per_step": round(busy / 1000 / steps, 2),
        "by_family": [
            {"family": f, "per_step": round(n / steps, 1), "us_per_step": round(t / steps, 1)}
            for f, (t, n) in sorted(by_family.items(), key=lambda kv: -kv[1][1])
        ],
        "runtime_calls_per_step": {
            name: round(n / steps, 2) for name, n in runtime_calls(every).items()
        },
    }


def decode_block_fits(threads: int) -> bool:
    """Whether the ragged decode attention builds with `threads` a block: whole warps, and
    its static shared memory (the warps' results, combined at the end) under CUDA's 48 KB
    past 512 threads."""
    return threads % 32 == 0 and 32 <= threads <= 512
