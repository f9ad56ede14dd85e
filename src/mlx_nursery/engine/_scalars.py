"""One-element arrays handed to the engine's CUDA kernels (a write index, a scale), made once
per value: every layer of a step passes the same ones, and each new array costs the host an
allocation and a copy. Made from host values, so they are ready on any thread's stream."""

from __future__ import annotations

import mlx.core as mx

_made: dict[tuple[float, mx.Dtype], mx.array] = {}


def scalar(value: float, dtype: mx.Dtype) -> mx.array:
    """`value` as a one-element array of `dtype`, made once while it is recent. Any thread."""
    key = (value, dtype)
    array = _made.get(key)
    if array is None:
        if len(_made) > 64:  # write indexes move on: keep only the recent ones
            _made.clear()
        array = _made[key] = mx.array([value], dtype=dtype)
    return array
