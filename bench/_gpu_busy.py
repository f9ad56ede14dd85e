"""The GPU's busy share beside a load: `nvidia-smi`'s utilization (the share of its sample
period in which a kernel ran) every half second, timestamped here, so that a run reports it
over its own measured window (not the server's start, warm-up or drain). Used by
`bench/serving.py`; on a machine without `nvidia-smi` (Metal, the CPU) nothing is sampled.

Issue 32 asks for the GPU's busy time beside every served load: the device scripts sampled
it in shell and averaged by hand, where a crude window (the middle of all samples) mixed
idle start-up into the figure."""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Sequence

import trio

PERIOD_MS = 500
"""nvidia-smi's sample period: its utilization is the busy share of each such period."""

COMMAND = (
    "nvidia-smi",
    "--query-gpu=utilization.gpu",
    "--format=csv,noheader,nounits",
    f"--loop-ms={PERIOD_MS}",
)


class GpuBusy:
    """Utilization samples as (time.perf_counter() when read, percent); one per line, and
    per GPU on a machine of several (their mean, for a server on all of them)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.ended = trio.Event()
        """Set when the sampler's output ended (it exited, or was stopped)."""

    def take(self, line: str, at: float) -> None:
        """Record one line of output read at `at`; a line that is not a number (nvidia-smi's
        "[N/A]", an error) is skipped."""
        try:
            value = float(line.strip())
        except ValueError:
            return
        if math.isfinite(value):
            self.samples.append((at, value))

    def mean(self, start: float, end: float) -> float | None:
        """The mean utilization of the samples read within [start, end] (perf_counter
        seconds), rounded to a tenth; None when none was."""
        inside = [value for at, value in self.samples if start <= at <= end]
        return round(sum(inside) / len(inside), 1) if inside else None


@contextlib.asynccontextmanager
async def sample_gpu_busy(command: Sequence[str] = COMMAND) -> AsyncIterator[GpuBusy | None]:
    """Sample while the block runs: yields a `GpuBusy` filling in the background, or None
    when `command`'s program is not installed. On exit the sampler is stopped (and its
    output read to the end). Cancellation: the block's cancellation stops the sampler too."""
    if shutil.which(command[0]) is None:
        yield None
        return
    busy = GpuBusy()
    process = await trio.lowlevel.open_process(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    stdout = process.stdout

    async def read() -> None:
        pending = b""
        try:
            async for chunk in stdout:
                at = time.perf_counter()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    busy.take(line.decode(errors="replace"), at)
        finally:
            busy.ended.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            try:
                yield busy
            finally:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
    finally:
        with trio.CancelScope(shield=True):
            await process.wait()
