"""Device probe (issue 32), kept out of the engine: MLX's CUDA allocator under the served
load. Runs `bench/step_anatomy.py` (its arguments pass through) in this process and, beside
it, samples every 2 s MLX's buffer cache and active memory and the CUDA default memory
pool's reserved and used bytes. Optional, from the environment:

  POOL_THRESHOLD=max|BYTES  the default pool's release threshold (CUDA's default is 0: at
                            each synchronization the pool hands its unused memory back)
  SPY=SECONDS:DELAY         py-spy (/tmp/spy/bin/py-spy, --native, 50 Hz) on this process
                            for SECONDS, DELAY s after start, into $SPY_OUT
  PROBE_OUT=PATH            the samples as JSON
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time

import mlx.core as mx

sys.path.insert(0, "bench")
import step_anatomy  # noqa: E402

RELEASE_THRESHOLD, RESERVED_CURRENT, USED_CURRENT = 4, 5, 7


def _pool() -> tuple[ctypes.CDLL | None, ctypes.c_void_p]:
    cuda = ctypes.CDLL("libcuda.so.1")
    for call in ("cuInit",):
        assert getattr(cuda, call)(0) == 0, call
    device = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
    pool = ctypes.c_void_p()
    assert cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device) == 0
    return cuda, pool


def _attr(cuda: ctypes.CDLL | None, pool: ctypes.c_void_p, attr: int) -> int:
    if cuda is None:
        return 0
    value = ctypes.c_uint64()
    assert cuda.cuMemPoolGetAttribute(pool, attr, ctypes.byref(value)) == 0
    return value.value


def main() -> None:
    # MLX reads these at its first command buffer and attention, which this probe's own
    # first evaluation would run before the engine sets them: set as the engine does.
    os.environ.setdefault("MLX_USE_CUDA_GRAPHS", "0")
    os.environ.setdefault("MLX_CUDA_USE_CUDNN_SDPA", "0")
    mx.eval(mx.zeros(1) + 1)  # CUDA initialized by MLX first
    try:
        cuda, pool = _pool()
    except OSError:  # no CUDA driver (a CPU check of this script)
        cuda, pool = None, ctypes.c_void_p()
    threshold = os.environ.get("POOL_THRESHOLD")
    if threshold and cuda is not None:
        value = ctypes.c_uint64(2**64 - 1 if threshold == "max" else int(threshold))
        assert cuda.cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, ctypes.byref(value)) == 0
    samples: list[dict[str, float]] = []
    t0 = time.monotonic()
    done = threading.Event()

    def sample() -> None:
        while not done.wait(2.0):
            samples.append(
                {
                    "t": round(time.monotonic() - t0, 1),
                    "cache_gb": mx.get_cache_memory() / 1e9,
                    "active_gb": mx.get_active_memory() / 1e9,
                    "pool_reserved_gb": _attr(cuda, pool, RESERVED_CURRENT) / 1e9,
                    "pool_used_gb": _attr(cuda, pool, USED_CURRENT) / 1e9,
                }
            )

    threading.Thread(target=sample, daemon=True).start()
    spy = os.environ.get("SPY")
    if spy:
        seconds, _, delay = spy.partition(":")

        def record() -> None:
            time.sleep(float(delay))
            subprocess.run(
                ["/tmp/spy/bin/py-spy", "record", "-p", str(os.getpid()), "-d", seconds,
                 "-r", "50", "--native", "--idle", "--threads", "-f", "raw", "-o",
                 os.environ["SPY_OUT"]],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
            )

        threading.Thread(target=record, daemon=True).start()
    try:
        step_anatomy.main()
    finally:
        done.set()
        out = os.environ.get("PROBE_OUT")
        if out:
            release = _attr(cuda, pool, RELEASE_THRESHOLD)
            with open(out, "w") as f:
                json.dump({"release_threshold": release, "samples": samples}, f, indent=1)


if __name__ == "__main__":
    sys.argv[0] = "bench/step_anatomy.py"
    main()
