"""The running batch's KV cache: mlx-lm's `BatchKVCache` without host syncs or gathers on
leave, and with each row's start known on the host.

mlx-lm's `BatchKVCache` (left-padded rows sharing one write index) is what `BatchGenerator`
decodes with. Two of its methods cost every stream of a busy server, measured on an H100
under arrivals (`bench/step_anatomy.py`, docs/benchmarks.md):

- `filter` (a row leaves) reads the rows' left padding back to the host (`tolist`), which
  waits for every step in flight, and copies the kept rows' KV with a gather, one element
  at a time, at a fraction of the memory bandwidth a contiguous copy reaches;
- `extract` (a finished row's KV, for the prefix cache) evaluates the padding first, once
  per layer: another wait for everything in flight.

`RaggedBatchKVCache` keeps the same layout, arrays and invariants (so every mlx-lm code path
that uses a `BatchKVCache` works unchanged), plus `padding`: each row's left padding as a
host list, kept in step by every method that changes it. `filter` then copies the kept
rows as contiguous runs (usually one or two slices) and rebuilds `offset` and
`left_padding` from the host (`offset` is always the write index less the row's padding);
`extract` slices without a sync. `offset` and `left_padding` come from the host after every
change (`update_and_fetch`, `prepare`, `finalize`, `trim`, `extend`), one pair of arrays
for all the layers of a forward: mlx-lm adds to each layer's own on the device, a kernel
per layer for the same values (for `offset`, every step). `finalize` (after a chunk of
prompts of unequal lengths) moves only the padded rows' tokens, as slices, where mlx-lm
gathers every row's whole buffer.
The decode attention on CUDA (`_decode_attention.py`) reads the rows' starts from
`left_padding` on the device, not from the host list.

Every buffer this class makes is a whole number of mlx-lm's steps long (`KV_STEP`): merged
and grown so; and where the decode attention reads each row from its own start (the ragged
kernel on CUDA: `read_from_row_starts`), a filter drops whole steps of the common padding
only (a row may keep up to a step less one of extra padding, which that kernel never
reads; elsewhere mlx-lm's masked attention would read it, so the filter drops all of it,
as mlx-lm's does). mlx-lm's lengths are any number, so each join and leave freed the whole
batch's KV in buffers of sizes never asked for again; MLX reuses a freed buffer only for a
request of about its size, and on CUDA those buffers filled its cache until the memory pool
held the whole device, after which every step's allocations missed the cache
(docs/benchmarks.md, "MLX's buffer cache under a busy batch"). In whole steps, a batch's
sizes recur as rows come and go.

A row joins from a `RowKVCache` (`_row_cache.py`), whose `merge` makes this class: every
sequence's cache is one (`ragged_rows`). Engine thread only.
"""

from __future__ import annotations

import threading
from typing import Any

import mlx.core as mx

from . import _kv_append
from ._memory import KV_STEP, whole_steps
from ._row_cache import RowKVCache as RowKVCache
from ._row_cache import copy_sharing_buffers, updated
from ._row_cache import ragged_rows as ragged_rows
from ._upstream import BatchKVCache, KVCache


class RaggedBatchKVCache(BatchKVCache):  # type: ignore[misc]  # mlx-lm is untyped
    """`BatchKVCache` with its rows' left padding mirrored on the host (module docstring)."""

    keys: mx.array | None
    values: mx.array | None
    offset: mx.array
    left_padding: mx.array
    _idx: int
    pending_write: mx.array | None = None
    """The marker of the latest write in place (`written`), which an ordered writer's next
    write takes as an input (`_kv_append`'s docstring); None after an update of MLX's, and
    with CUDA graphs known off (`_kv_append.kept`)."""

    def __init__(self, left_padding: list[int]) -> None:
        super().__init__(left_padding)
        self.padding: list[int] = [int(p) for p in left_padding]
        """Each row's left padding, as `left_padding` holds it on the device."""
        self._right_host: list[int] | None = None
        self._own_buffers = True
        """New keys may be written into the buffers in place (`_kv_append`): no array made
        outside this cache shares them, and no reader made before may cover the positions
        written next. False after `state` was set or the index moved back (`trim`), until
        the next update (MLX's) makes them its own again."""

    def prepare(
        self,
        *,
        left_padding: list[int] | None = None,
        lengths: list[int] | None = None,
        right_padding: list[int] | None = None,
    ) -> None:
        """As mlx-lm's, with `left_padding` and `offset` made from the host, one pair for
        every layer (mlx-lm adds on the device, per layer)."""
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("Left padding can only be added to an empty BatchKVCache")
            self.padding = [p + int(q) for p, q in zip(self.padding, left_padding, strict=True)]
            self._sync_device_padding()
        if right_padding is not None and max(right_padding) > 0:
            self._right_host = [int(q) for q in right_padding]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        return updated(self, keys, values, self._updated_by_mlx)  # no copy while read

    def _updated_by_mlx(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        fetched: tuple[mx.array, mx.array] = super().update_and_fetch(keys, values)
        self.offset = _offsets(self._idx, self.padding)  # mlx-lm's `offset + n` unused
        return fetched

    def write_slot(self, dtype: mx.Dtype, length: int, *, ordered: bool = False) -> int | None:
        """Where `length` new tokens of `dtype` go when the caller writes them into the
        buffers in place (`_kv_append`, `_decode_prelude`), then calls `written`; None where
        they may not be written so (no buffers yet, buffers not this cache's own, another
        dtype, not CUDA; under CUDA graphs, a writer that is not `ordered`, as `_kv_append`
        says): `update_and_fetch` then. Grows the buffers to hold them."""
        if self.keys is None or self.values is None:
            return None
        needed = self._idx + length
        if needed > self.keys.shape[2]:
            _kv_append.settle(self.pending_write)  # the growth copies the buffers: MLX's
            self.keys = _grown(self.keys, self._idx, needed)  # mlx-lm's growth, to whole steps
            self.values = _grown(self.values, self._idx, needed)
            self._own_buffers = True
        if not (
            self._own_buffers
            and dtype == self.keys.dtype == self.values.dtype
            and _kv_append.writes_in_place(dtype, ordered=ordered)
        ):
            return None
        return self._idx

    def written(self, marker: mx.array, length: int) -> None:
        """`length` tokens were written at the write slot by the kernel whose output is
        `marker`: everything reading the buffers from now on is launched after it."""
        assert self.keys is not None and self.values is not None
        self.keys, self.values = mx.depends([self.keys, self.values], [marker])
        self.pending_write = _kv_append.kept(marker)
        self._idx += length
        self.offset = _offsets(self._idx, self.padding)

    def trim(self, n: int) -> int:
        """As mlx-lm's (speculation's realignment after a verify), `offset` from the host."""
        n = min(self._idx, n)
        self._idx -= n
        self.offset = _offsets(self._idx, self.padding)
        if n:  # a forward still lazy may read past the new index: no writes in place there
            self._own_buffers = False
            self.pending_write = None
        return n

    def finalize(self) -> None:
        """As mlx-lm's: each row's tokens moved right by its right padding, which joins its
        left padding; `left_padding` and `offset` from the host. mlx-lm rolls every row's
        whole buffer with a gather, an element at a time: after a chunk of prompts that
        reuse a long cached prefix, that is every row's whole prefix (`moved_right`)."""
        right = self._right_host
        if right is None:
            return
        assert self.keys is not None and self.values is not None
        self.keys = moved_right(self.keys, self.padding, self._idx, right)
        self.values = moved_right(self.values, self.padding, self._idx, right)
        self.padding = [p + q for p, q in zip(self.padding, right, strict=True)]
        self._right_host = None
        self._sync_device_padding()

    def filter(self, batch_indices: Any) -> None:
        """Keep the rows `batch_indices` (ascending, as mlx-lm passes them): contiguous
        copies, no host sync; the padding common to all kept rows is dropped (in whole
        steps where the decode attention reads rows from their starts)."""
        keep = [int(i) for i in batch_indices]
        padding = [self.padding[i] for i in keep]
        step = KV_STEP if _layout.rows_read_from_their_starts else 1  # module docstring
        shift = (min(padding) // step) * step if padding else 0
        if self.keys is not None and self.values is not None:
            self.keys = _rows(self.keys, keep, shift)
            self.values = _rows(self.values, keep, shift)
        self._idx -= shift
        self.padding = [p - shift for p in padding]
        self._sync_device_padding()

    def extend(self, other: Any) -> None:
        own = self.padding
        theirs = (
            other.padding
            if isinstance(other, RaggedBatchKVCache)
            else _host_list(other.left_padding)  # another class: read once
        )
        if self.keys is not None or other.keys is not None:  # rows align on the later index
            index = max(self._idx, other._idx)
            own = [p + index - self._idx for p in own]
            theirs = [p + index - other._idx for p in theirs]
        super().extend(other)
        self.padding = own + theirs
        self._sync_device_padding()  # mlx-lm's concatenations, per layer, go unused

    def extract(self, idx: int) -> KVCache:
        """Row `idx`'s KV as a lone `RowKVCache` (a copy), without waiting for the device."""
        if self.keys is None or self.values is None:
            raise ValueError("no KV to extract: the cache holds no tokens")
        cache = RowKVCache()
        start = self.padding[idx]
        cache.keys = mx.contiguous(self.keys[idx : idx + 1, :, start : self._idx])
        cache.values = mx.contiguous(self.values[idx : idx + 1, :, start : self._idx])
        cache.offset = self._idx - start
        return cache

    @classmethod
    def merge(cls, caches: list[Any]) -> RaggedBatchKVCache:
        """As mlx-lm's (rows right-aligned at the longest row's length), in a buffer of
        whole steps (module docstring)."""
        lengths = [c.size() for c in caches]
        index = max(lengths, default=0)
        merged = cls([index - n for n in lengths])
        if index == 0:  # mlx-lm builds its own class for this one
            return merged
        held = [c for c in caches if c.keys is not None]
        heads = max(c.keys.shape[1] for c in held)
        dtype = held[0].keys.dtype
        capacity = whole_steps(index)
        keys = mx.zeros((len(caches), heads, capacity, max(c.keys.shape[3] for c in held)), dtype)
        values = mx.zeros(
            (len(caches), heads, capacity, max(c.values.shape[3] for c in held)), dtype
        )
        for row, (cache, length) in enumerate(zip(caches, lengths, strict=True)):
            if cache.keys is not None and length:
                start = index - length
                keys[row : row + 1, :, start:index] = cache.keys[..., :length, :]
                values[row : row + 1, :, start:index] = cache.values[..., :length, :]
        merged.keys, merged.values, merged._idx = keys, values, index
        merged.offset = mx.array(lengths, dtype=mx.int32)  # not shared: no layer's yet
        return merged

    def __deepcopy__(self, memo: dict[int, Any]) -> RaggedBatchKVCache:
        return copy_sharing_buffers(self, memo)

    @property
    def state(self) -> Any:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, value: Any) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = value
        self.padding = _host_list(self.left_padding)
        self._own_buffers = False  # the arrays may be another cache's too
        self.pending_write = None

    def _sync_device_padding(self) -> None:
        """Set `left_padding` and `offset` from the host list (no device reads). Every layer
        of a batch filters to the same rows: the arrays are made once and shared (MLX
        arrays are immutable, and the cache only ever rebinds them)."""
        key = (self._idx, tuple(self.padding))
        made = _shared.padding
        arrays = made.get(key)
        if arrays is None:
            made.clear()  # only the latest filter's are shared
            arrays = made[key] = (
                mx.array(self.padding, dtype=mx.int32),
                mx.array([self._idx - p for p in self.padding], dtype=mx.int32),
            )
        self.left_padding, self.offset = arrays


class _Layout:
    """Process-wide: whether the decode attention reads each row of a batch from its own
    start (set once, by `read_from_row_starts`)."""

    rows_read_from_their_starts = False


_layout = _Layout()


def read_from_row_starts() -> None:
    """Say that the batch's decode attention reads each row from its own start (the ragged
    kernel: `_decode_attention.install`), so that a filter may leave padding it never reads
    (module docstring). Process-wide, as the install it follows; any thread."""
    _layout.rows_read_from_their_starts = True


def shift_rows(layers: list[RaggedBatchKVCache], shifts: list[int]) -> None:
    """Move each row i's tokens `shifts[i]` positions right, to end at the write index
    again, its left padding growing by as much (speculation's realignment after a verify:
    the positions a row did not keep lie between its tokens and the index).

    mlx-lm's `finalize` does this with a gather over every row's whole buffer; here only the
    rows that move, and only their tokens, are copied as contiguous slices, written back in
    place: the copies are evaluated first, so that each layer's buffer is then referenced by
    its update alone and MLX writes into it rather than copying it."""
    moving = [(i, s) for i, s in enumerate(shifts) if s > 0]
    if not moving:
        return
    copies: list[list[tuple[mx.array, mx.array]]] = []
    for layer in layers:
        keys, values, index = layer.keys, layer.values, layer._idx
        assert keys is not None and values is not None
        copies.append(
            [
                (
                    mx.contiguous(keys[i : i + 1, :, layer.padding[i] : index - s]),
                    mx.contiguous(values[i : i + 1, :, layer.padding[i] : index - s]),
                )
                for i, s in moving
            ]
        )
    mx.eval(copies)
    for layer, moved in zip(layers, copies, strict=True):
        assert layer.keys is not None and layer.values is not None
        for (i, s), (k, v) in zip(moving, moved, strict=True):
            start = layer.padding[i] + s
            layer.keys[i : i + 1, :, start : layer._idx] = k
            layer.values[i : i + 1, :, start : layer._idx] = v
        layer.padding = [p + s for p, s in zip(layer.padding, shifts, strict=True)]
        layer._sync_device_padding()


def moved_right(buffer: mx.array, padding: list[int], index: int, shifts: list[int]) -> mx.array:
    """`buffer` (B, H, L, D) with each row i's tokens (from `padding[i]` up to `index -
    shifts[i]`) moved `shifts[i]` positions right, to end at `index`, as mlx-lm's
    `dynamic_roll` puts them; what lies before them is left padding, never read (a
    `padding` of zeros moves the padding along). Lazy: the buffer is copied once (the
    forward that wrote it may still be in flight, so MLX cannot write into it in place
    without a wait), then each moving row's tokens as one contiguous slice; no gather."""
    moving = [
        (row, padding[row], shift)
        for row, shift in enumerate(shifts)
        if shift > 0 and index - shift > padding[row]
    ]
    if not moving:
        return buffer
    moved = mx.contiguous(buffer)  # a new array: the updates below must not rebind `buffer`
    for row, start, shift in moving:
        moved[row : row + 1, :, start + shift : index] = buffer[
            row : row + 1, :, start : index - shift
        ]
    return moved


def _grown(buffer: mx.array, index: int, needed: int) -> mx.array:
    """`buffer` (B, H, L, D) with room for `needed` positions, in whole steps: its first
    `index` positions kept, zeros after (mlx-lm keeps `index` and adds whole steps, so a
    buffer's length is then any number)."""
    batch, heads, _, dim = buffer.shape
    capacity = whole_steps(needed)
    room = mx.zeros((batch, heads, capacity - index, dim), buffer.dtype)
    return mx.concatenate([buffer[..., :index, :], room], axis=2)


def _offsets(index: int, padding: list[int]) -> mx.array:
    """Each row's tokens (the write index less its padding) as a device array, made once for
    every layer of a step: a forward's layers ask in turn, with the same index and padding."""
    key = (index, tuple(padding))
    made = _shared.offsets
    array = made.get(key)
    if array is None:
        made.clear()  # only the latest forward's layers share it
        array = made[key] = mx.array([index - p for p in padding], dtype=mx.int32)
    return array


class _Shared(threading.local):
    """The arrays the layers of the latest forward share, per engine thread: each engine
    runs its model on a thread of its own, with MLX streams of that thread, and these arrays
    are lazy (computed on the stream of the thread that evaluates them first)."""

    def __init__(self) -> None:
        self.offsets: dict[tuple[int, tuple[int, ...]], mx.array] = {}
        self.padding: dict[tuple[int, tuple[int, ...]], tuple[mx.array, mx.array]] = {}
        """`left_padding` and `offset` of the last (write index, padding) set from the host."""


_shared = _Shared()


def _rows(buffer: mx.array, keep: list[int], shift: int) -> mx.array:
    """Rows `keep` of `buffer` (B, H, L, D) from position `shift` on, as contiguous slices."""
    runs: list[tuple[int, int]] = []
    for i in keep:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    if not runs:
        return buffer[:0]
    if runs == [(0, buffer.shape[0])] and shift == 0:
        return buffer
    parts = [buffer[a:b, :, shift:, :] for a, b in runs]
    return mx.concatenate(parts, axis=0) if len(parts) > 1 else mx.contiguous(parts[0])


def _host_list(values: mx.array) -> list[int]:
    """A small int array's values on the host (waits for the device to compute them)."""
    listed = values.tolist()
    assert isinstance(listed, list)
    return [int(v) for v in listed]  # type: ignore[arg-type]
