"""A padded prefill chunk's `finalize` on four rows that each reuse a cached ~8,000-token
prefix (Llama-3.1-8B's KV shapes: 32 layers, 8 KV heads of 128, bf16): mlx-lm's roll (a
gather over every row's whole buffer, as the engine did before) against `moved_right` (one
copy of the buffer, then each moving row's tokens as a slice). Device time of the 64 arrays'
moves, evaluated alone; the moved tokens compared."""

import json
import sys
import time

import mlx.core as mx

from mlx_nursery.engine._ragged import moved_right

ROWS, HEADS, DIM, LAYERS = 4, 8, 128, 32
INDEX, LENGTH = 8040, 8192
PADDING, SHIFTS = [0, 5, 12, 30], [3, 0, 1, 2]


def rolled(buffer: mx.array, shifts: list[int]) -> mx.array:
    positions = mx.arange(buffer.shape[2])[None, None, :, None]
    index = (positions - mx.array(shifts)[:, None, None, None]) % buffer.shape[2]
    return mx.take_along_axis(buffer, index, axis=2)


def timed(fn, buffers) -> float:
    mx.synchronize()
    start = time.perf_counter()
    out = [fn(b) for b in buffers]
    mx.eval(out)
    mx.synchronize()
    return (time.perf_counter() - start) * 1e3


buffers = [
    mx.random.normal((ROWS, HEADS, LENGTH, DIM), key=mx.random.key(i)).astype(mx.bfloat16)
    for i in range(2 * LAYERS)
]
mx.eval(buffers)
old = lambda b: rolled(b, SHIFTS)  # noqa: E731
new = lambda b: moved_right(b, PADDING, INDEX, SHIFTS)  # noqa: E731
for fn in (old, new):
    timed(fn, buffers[:4])  # build the kernels
results = {"old_ms": [], "new_ms": []}
for _ in range(5):
    results["old_ms"].append(round(timed(old, buffers), 2))
    results["new_ms"].append(round(timed(new, buffers), 2))
a, b = old(buffers[0]), new(buffers[0])
same = all(
    bool(mx.array_equal(a[r, :, PADDING[r] + s : INDEX], b[r, :, PADDING[r] + s : INDEX]))
    for r, s in enumerate(SHIFTS)
)
results["same_tokens"] = same
results["device"] = str(mx.default_device())
json.dump(results, sys.stdout)
print()
