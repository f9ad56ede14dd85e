"""bench/step_anatomy.py: its `--cache-limit-gb` holds where the engine bounds MLX's buffer
cache itself (CUDA), instead of being replaced by the engine's start."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import mlx.core as mx
import pytest

from mlx_nursery.engine import _memory

ROOT = Path(__file__).resolve().parents[2]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_step_anatomy", ROOT / "bench" / "step_anatomy.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_the_cache_limit_replaces_the_engines_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    anatomy = _load_tool()
    monkeypatch.setattr(_memory, "BUFFER_CACHE_FRACTION", _memory.BUFFER_CACHE_FRACTION)
    memory = _memory.device_memory(mx.device_info())
    assert memory is not None
    limit = memory // 4  # not the engine's tenth
    before = mx.set_cache_limit(limit)
    try:
        anatomy._limit_buffer_cache(limit)
        # what the engine's start sets on CUDA (`_backend.bound_cuda_buffer_cache`)
        assert _memory.bound_buffer_cache(True, memory) == pytest.approx(limit, abs=1)
        assert _memory.bound_buffer_cache(False, memory) is None  # elsewhere: untouched
    finally:
        mx.set_cache_limit(before)


def test_the_devices_idle_time_is_split_by_the_host_phase_in_force() -> None:
    _load_tool()  # puts bench/ on the path, as the tool runs
    from _timeline import idle_by_phase

    kernels = [(10.0, 20.0), (15.0, 30.0), (50.0, 60.0)]  # idle: 0-10, 30-50, 60-100
    host = [(0.0, "decode"), (25.0, "launch (decode)"), (40.0, "rest"), (55.0, "decode")]
    idle = idle_by_phase(kernels, host, (0.0, 100.0))
    assert idle == {"decode": 50.0, "launch (decode)": 10.0, "rest": 10.0}
    # before the host's first change the phase is not known; kernels outside the window
    # do not count
    assert idle_by_phase([(-5.0, 5.0)], [(8.0, "rest")], (0.0, 10.0)) == {
        "unknown": 3.0,
        "rest": 2.0,
    }
