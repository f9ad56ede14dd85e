"""The device's kernels over a window of a busy run, and what the engine thread was doing
while the device sat idle (`step_anatomy.py --kernels`).

A step bound by its host leaves the device idle between kernels; which host phase those
gaps fall in says where to cut: a gap inside the decode step's Python means the device ran
out of work while the next step was being built, one inside a launch means it waits for
MLX's next command buffer to be committed, one inside "rest" that the engine loop's other
work starved it. Kernel spans come from CUPTI (torch.profiler, which sees MLX's kernels);
the host's from `Phases.log`, aligned to the profiler's clock by a marker range recorded at
the window's start.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import trio
from _kernels import busy_us, runtime_calls
from _phases import Phases

Span = tuple[float, float]


def union(spans: list[Span]) -> list[Span]:
    """`spans` merged where they overlap, in order."""
    merged: list[Span] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def idle_by_phase(
    kernels: list[Span], host: list[tuple[float, str]], window: Span
) -> dict[str, float]:
    """Microseconds of `window` with no kernel running, by the host phase in force then.

    `host`: (time, the phase from then on), in time order, on the kernels' clock; before its
    first entry the phase is "unknown"."""
    start, end = window
    gaps: list[Span] = []
    cursor = start
    for a, b in union(kernels):
        if b <= start or a >= end:
            continue
        if a > cursor:
            gaps.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < end:
        gaps.append((cursor, end))
    segments: list[tuple[float, float, str]] = []
    label, since = "unknown", start
    for t, next_label in host:
        if t > since:
            segments.append((since, t, label))
        label, since = next_label, max(since, t)
    segments.append((since, end, label))
    idle: dict[str, float] = defaultdict(float)
    i = 0
    for a, b in gaps:
        while i < len(segments) and segments[i][1] <= a:
            i += 1
        j = i
        while j < len(segments) and segments[j][0] < b:
            s, e, name = segments[j]
            overlap = min(b, e) - max(a, s)
            if overlap > 0:
                idle[name] += overlap
            j += 1
    return dict(idle)


async def profile_kernels(duration: float, into: dict[str, Any], phases: Phases) -> None:
    """CUDA kernels' device time over a window in the middle of the run, grouped by name,
    the device's idle time by the engine thread's phase, and the host's CUDA calls (buffer
    allocations, graphs built and updated) a decode step. Only where torch with CUDA is
    installed (the GPU machine)."""
    try:
        from torch.autograd.profiler import record_function
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        into["error"] = "no torch.profiler"
        return
    await trio.sleep(duration / 3)
    window = min(3.0, duration / 3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("nursery-align"):
            origin = time.perf_counter()
            phases.log = []
        steps_before = phases.calls["decode"]
        try:
            await trio.sleep(window)
        finally:
            log, phases.log = phases.log, None
        decode_steps = phases.calls["decode"] - steps_before
    events = list(prof.events())
    marker = next(
        (e for e in events if e.name == "nursery-align" and e.device_type.name == "CPU"), None
    )
    kernels = [
        e
        for e in events
        if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)
    ]
    into["window_s"] = window
    into["decode_steps"] = decode_steps
    if marker is None:
        into["error"] = "the profiler kept no marker range: no host timeline"
        return
    zero = marker.time_range.start  # the profiler's clock at `origin`, within the marker
    lo, hi = zero, zero + window * 1e6
    inside = [e for e in kernels if e.time_range.end > lo and e.time_range.start < hi]
    spans = [(max(e.time_range.start, lo), min(e.time_range.end, hi)) for e in inside]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in inside:
        by_name[e.name[:90]][0] += e.time_range.end - e.time_range.start
        by_name[e.name[:90]][1] += 1
    into["busy_share"] = round(busy_us(spans) / (hi - lo), 3)
    into["kernels"] = len(spans)
    into["top"] = [
        {"name": name, "ms": round(t / 1000, 2), "count": n}
        for name, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:40]
    ]
    host = [(zero + (t - origin) * 1e6, label) for t, label in log or []]
    idle = idle_by_phase(spans, host, (lo, hi))
    runtime = list(runtime_calls(events, lo, hi).items())[:24]
    into["runtime_calls_per_decode_step"] = {
        name: round(n / max(decode_steps, 1), 2) for name, n in runtime
    }
    into["idle_ms_by_phase"] = {
        name: round(us / 1000, 2) for name, us in sorted(idle.items(), key=lambda kv: -kv[1])
    }
