"""One sequence's KV cache, written in place on CUDA, and batched as a ragged batch.

`RowKVCache` is mlx-lm's `KVCache` (one sequence, a buffer grown in steps) with two
changes:

- `merge` makes a `RaggedBatchKVCache` (`_ragged.py`): a row the batch takes joins it
  without the host syncs and gathers of mlx-lm's `BatchKVCache`;
- its keys and values are written into the buffers in place (`_kv_append`) where that is
  safe, as the batch's are. mlx-lm writes them with a slice update, which MLX performs in
  place only when nothing else holds the buffer; a lone stream launches each step before
  the one before it has run (the host is ahead of the device), so the buffers are still
  held by that step's attention and MLX copies each layer's whole buffer to add one token:
  two more kernels a layer and array a step (a copy of the buffer, then the write), and a
  read and write of the sequence's whole KV, for a stream whose step is bound by the host
  launching kernels (decisions/0056).

The rules are the batch's (`_kv_append`'s docstring): writes go only at the write index
and beyond, where no lazy reader of older arrays reads; the buffers must be this cache's
own. They are after an update of MLX's (which copied them, or had them alone), and stop
being after `trim` (a lazy forward may read past the new index), after `state` is set and
after a deep copy (the arrays may be another cache's: the prefix cache hands out deep
copies of its entries, which share the entries' buffers). A plain `KVCache` made a row in
place (`ragged_rows`) starts without: its next write is MLX's. Engine thread only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import mlx.core as mx

from . import _kv_append
from ._upstream import KVCache

if TYPE_CHECKING:
    from ._ragged import RaggedBatchKVCache


class RowKVCache(KVCache):  # type: ignore[misc]  # mlx-lm is untyped
    """mlx-lm's `KVCache`, batched as a `RaggedBatchKVCache`, written in place where it may
    be (module docstring)."""

    keys: mx.array | None
    values: mx.array | None
    offset: int
    _own_buffers = False
    """New keys may be written into the buffers in place. A class default: a `KVCache`
    whose class `ragged_rows` changed has no attribute of its own yet."""
    pending_write: mx.array | None = None
    """The marker of the latest write in place (`written`), which an ordered writer's next
    write takes as an input (`_kv_append`'s docstring); None after an update of MLX's, and
    with CUDA graphs known off (`_kv_append.kept`)."""

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        return updated(self, keys, values, super().update_and_fetch)

    def write_slot(self, dtype: mx.Dtype, length: int, *, ordered: bool = False) -> int | None:
        """Where `length` new tokens of `dtype` go when the caller writes them into the
        buffers in place (`_kv_append`, `_decode_prelude`), then calls `written`; None where
        they may not be written so (no buffers, or too short: mlx-lm's update grows them;
        buffers not this cache's own, another dtype, not CUDA; under CUDA graphs, a writer
        that is not `ordered`, as `_kv_append` says): `update_and_fetch` then."""
        if (
            self.keys is None
            or self.values is None
            or not self._own_buffers
            or self.offset + length > self.keys.shape[2]
            or not dtype == self.keys.dtype == self.values.dtype
            or not _kv_append.writes_in_place(dtype, ordered=ordered)
        ):
            return None
        return self.offset

    def written(self, marker: mx.array, length: int) -> None:
        """`length` tokens were written at the write slot by the kernel whose output is
        `marker`: everything reading the buffers from now on is launched after it."""
        assert self.keys is not None and self.values is not None
        self.keys, self.values = mx.depends([self.keys, self.values], [marker])
        self.pending_write = _kv_append.kept(marker)
        self.offset += length

    def trim(self, n: int) -> int:
        trimmed: int = super().trim(n)
        if trimmed:  # a forward still lazy may read past the new index
            self._own_buffers = False
            self.pending_write = None
        return trimmed

    @property
    def state(self) -> Any:
        return self.keys, self.values, self.offset

    @state.setter
    def state(self, value: Any) -> None:
        self.keys, self.values, self.offset = value
        self._own_buffers = False  # the arrays may be another cache's too
        self.pending_write = None

    def __deepcopy__(self, memo: dict[int, Any]) -> RowKVCache:
        return copy_sharing_buffers(self, memo)

    def merge(self, caches: list[Any]) -> RaggedBatchKVCache:
        from ._ragged import RaggedBatchKVCache  # the batch's module imports this one

        return RaggedBatchKVCache.merge(caches)


def updated(
    cache: Any, keys: mx.array, values: mx.array, by_mlx: Callable[..., Any]
) -> tuple[mx.array, mx.array]:
    """`keys` and `values` written into `cache`'s buffers in place at its write slot
    (`_kv_append`), or where its `write_slot` says they may not be, by `by_mlx` (mlx-lm's
    update: a pending write in place is committed first, `_kv_append.settle`, and the
    buffers it leaves are the cache's own); the keys and values it then holds. For this
    module's cache and the batch's (`RaggedBatchKVCache`), which keep the same rules."""
    length = keys.shape[2]
    index = cache.write_slot(keys.dtype, length) if keys.dtype == values.dtype else None
    if index is None:
        _kv_append.settle(cache.pending_write)  # MLX's update reads the buffers
        by_mlx_fetched: tuple[mx.array, mx.array] = by_mlx(keys, values)
        cache._own_buffers = True  # MLX's update copied the buffers or had them alone
        cache.pending_write = None
        return by_mlx_fetched
    written = _kv_append.append_in_place(cache.keys, cache.values, keys, values, index)
    cache.written(written, length)
    fetched: tuple[mx.array, mx.array] = cache.keys_and_values()
    return fetched


_Cache = TypeVar("_Cache")


def copy_sharing_buffers(cache: _Cache, memo: dict[int, Any]) -> _Cache:
    """A deep copy of `cache` (this module's or the batch's) whose arrays share its buffers
    (copying an MLX array does not copy its data, as mlx-lm's `PromptProcessingBatch.split`
    and the prefix cache's hits copy caches): neither writes into them in place until an
    update of MLX's has made them its own."""
    copied = type(cache).__new__(type(cache))
    memo[id(cache)] = copied
    for name, value in cache.__dict__.items():
        setattr(copied, name, copy.deepcopy(value, memo))
    copied._own_buffers = cache._own_buffers = False  # type: ignore[attr-defined]
    copied.pending_write = cache.pending_write = None  # type: ignore[attr-defined]
    return copied


def ragged_rows(cache: list[Any]) -> list[Any]:
    """`cache` (one sequence's, per layer) with each plain `KVCache` made a `RowKVCache` in
    place (the same object and arrays: how it batches and writes changes); other kinds
    (rotating windows, quantized rows, recurrent state) are left as they are."""
    for layer in cache:
        if type(layer) is KVCache:
            layer.__class__ = RowKVCache
    return cache


def is_plain_kv(layer: Any) -> bool:
    """`layer` holds a sequence's keys and values as mlx-lm's `KVCache` does (a buffer and
    an offset), as a plain `KVCache` or a `RowKVCache`: not a subclass of another layout."""
    return type(layer) is KVCache or type(layer) is RowKVCache
