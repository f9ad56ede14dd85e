"""Memory over a run, sampled beside it: MLX's active arrays and its cache of freed buffers
and, on CUDA, the device's default memory pool (reserved and in use, read through the
driver). What showed that MLX's cache filled until CUDA's pool held the whole device under a
busy batch (decisions/0055). Shared by the step benchmarks; reads counters only, never runs
anything on the device (so it cannot settle MLX's once-read switches before the engine)."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import mlx.core as mx
import trio

_RESERVED_CURRENT, _USED_CURRENT = 5, 7  # CUmemPool_attribute
_GB = 1e9


class CudaPool:
    """The device's default memory pool, through the CUDA driver (None where there is no
    driver: Metal, the CPU)."""

    def __init__(self, cuda: ctypes.CDLL, pool: ctypes.c_void_p) -> None:
        self._cuda = cuda
        self._pool = pool

    @classmethod
    def of_device(cls, device: int = 0) -> CudaPool | None:
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
        handle, pool = ctypes.c_int(), ctypes.c_void_p()
        if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(handle), device):
            return None
        if cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), handle):
            return None
        return cls(cuda, pool)

    def attribute(self, attribute: int) -> int:
        value = ctypes.c_uint64()
        self._cuda.cuMemPoolGetAttribute(self._pool, attribute, ctypes.byref(value))
        return int(value.value)


def sample(pool: CudaPool | None, t0: float) -> dict[str, float]:
    """One sample, in GB (1e9 bytes), at seconds since `t0`."""
    point = {
        "t": round(time.perf_counter() - t0, 1),
        "active_gb": round(mx.get_active_memory() / _GB, 2),
        "cache_gb": round(mx.get_cache_memory() / _GB, 2),
    }
    if pool is not None:
        point["pool_reserved_gb"] = round(pool.attribute(_RESERVED_CURRENT) / _GB, 2)
        point["pool_used_gb"] = round(pool.attribute(_USED_CURRENT) / _GB, 2)
    return point


async def watch_memory(duration: float, into: list[dict[str, Any]], every: float = 2.0) -> None:
    """Append a sample to `into` every `every` seconds for `duration` seconds (the run's)."""
    pool = CudaPool.of_device()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration:
        into.append(sample(pool, t0))
        await trio.sleep(every)
