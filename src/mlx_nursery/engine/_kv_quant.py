"""Quantized KV caches that continuous batching can use (`--kv-bits`).

mlx-lm 0.32.2 quantizes the KV cache only for a lone sequence (`QuantizedKVCache`, driven
by `generate_step`): it has no batch counterpart, so `BatchGenerator` cannot merge, extend,
filter or extract a quantized cache, and `mlx_lm.server` falls back to serial decoding when
`--kv-bits` is set. This module supplies the missing half:

- `QuantizedBatchKVCache`: mlx-lm's `BatchKVCache` (left-padded rows, one array per layer,
  grown in steps of 256 tokens) whose keys and values are `mx.quantize`'s triples (packed
  uint32, scales, biases). It has the `bits` and `group_size` attributes by which mlx-lm's
  attention (`models/base.py`, `scaled_dot_product_attention`) dispatches to
  `quantized_scaled_dot_product_attention`, whose masks take the batch's left padding.
- `QuantizedKVRow`: mlx-lm's `QuantizedKVCache`, plus the `merge` that `BatchGenerator`
  calls to batch rows. The fast path, the prefix cache and the batch's `extract` all hold
  rows of this class, so a sequence moves between them with its KV never dequantized.

Every KV cache of a model whose engine has `kv_bits` is made by `make_cache`: layers with a
growing `KVCache` get a quantized row; others (rotating windows, recurrent state) stay as
mlx-lm makes them. Quantization starts at the first token: mlx-lm's `quantized_kv_start`
(float until a sequence is that long) is not offered, because a batch holds one cache
class per layer for all its rows, and the KV budget counts one price per token
(docs/architecture.md, "Quantized KV cache"). Engine thread only, as all MLX work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import mlx.core as mx
from attrs import validators as v

from ._ragged import moved_right
from ._row_cache import is_plain_kv, ragged_rows
from ._upstream import (
    BaseCache,
    QuantizedKVCache,
    create_causal_mask,
    make_prompt_cache,
)

KV_BITS = (4, 8)
"""The bit widths offered: what mlx-lm's users run, and what the benchmarks measured."""
KV_GROUP_SIZES = (32, 64, 128)
"""`mx.quantize`'s group sizes; a model's head dimension must be a multiple of the one used."""

_Parts = tuple[mx.array, mx.array, mx.array]
"""A quantized array: packed values (uint32), scales, biases; the sequence axis is 2."""

CacheFactory = Callable[[Any], list[Any]]
"""Makes a fresh KV cache (one object per layer) for a model."""


@attrs.frozen
class KVQuantization:
    """How the KV cache is quantized: `bits` per value, one scale and bias per `group_size`
    values along a head's dimension."""

    bits: int = attrs.field(validator=v.in_(KV_BITS))
    group_size: int = attrs.field(default=64, validator=v.in_(KV_GROUP_SIZES))


class KVQuantizationError(ValueError):
    """The model's KV cannot be quantized as asked (its head dimension and the group size)."""


def make_cache(model: Any, quantization: KVQuantization | None) -> list[Any]:
    """A fresh KV cache for `model`, its growing layers quantized if `quantization` is set."""
    cache: list[Any] = make_prompt_cache(model)
    if quantization is None:
        return ragged_rows(cache)  # written in place where that is safe (`_row_cache`)
    return [
        QuantizedKVRow(quantization.group_size, quantization.bits) if is_plain_kv(c) else c
        for c in cache
    ]


def cache_factory(quantization: KVQuantization | None) -> CacheFactory:
    """`make_cache` bound to `quantization`: what the steppers call for a fresh cache."""
    return lambda model: make_cache(model, quantization)


def check_quantizable(model: Any, quantization: KVQuantization) -> None:
    """Raise `KVQuantizationError` if `model`'s keys or values cannot be quantized with this
    group size (their last dimension must be a multiple of it). Runs the model on one token:
    engine thread."""
    cache = make_cache(model, None)
    model(mx.array([[0]]), cache=cache)
    dims = {
        int(array.shape[-1])
        for layer in cache
        if is_plain_kv(layer) and layer.keys is not None
        for array in (layer.keys, layer.values)
    }
    bad = sorted(d for d in dims if d % quantization.group_size)
    if not bad:
        return
    fitting = [str(g) for g in KV_GROUP_SIZES if bad[0] % g == 0]
    if not fitting:
        raise KVQuantizationError(
            f"this model's KV head dimension ({bad[0]}) is not a multiple of any group size"
            f" MLX quantizes by ({', '.join(map(str, KV_GROUP_SIZES))}): run without --kv-bits"
        )
    raise KVQuantizationError(
        f"--kv-group-size {quantization.group_size} does not divide this model's KV head"
        f" dimension ({bad[0]}): choose {' or '.join(fitting)}"
    )


class QuantizedKVRow(QuantizedKVCache):  # type: ignore[misc]  # mlx-lm is untyped
    """One sequence's quantized KV (mlx-lm's `QuantizedKVCache`) that a batch can take in."""

    def size(self) -> int:
        return int(self.offset)

    @classmethod
    def merge(cls, caches: list[Any]) -> QuantizedBatchKVCache:
        return QuantizedBatchKVCache.merge(caches)


def _pad_seq(parts: _Parts, left: int, right: int) -> _Parts:
    if left == 0 and right == 0:
        return parts
    width = [(0, 0), (0, 0), (left, right), (0, 0)]
    return (mx.pad(parts[0], width), mx.pad(parts[1], width), mx.pad(parts[2], width))


def _slice_seq(parts: _Parts, start: int, end: int | None) -> _Parts:
    return (
        parts[0][..., start:end, :],
        parts[1][..., start:end, :],
        parts[2][..., start:end, :],
    )


class QuantizedBatchKVCache(BaseCache):  # type: ignore[misc]  # mlx-lm is untyped
    """mlx-lm's `BatchKVCache` with quantized keys and values (see the module docstring).

    The same bookkeeping as `BatchKVCache`, method for method: `left_padding` per row,
    `offset` per row (its position: what RoPE reads), `_idx` the filled length of the
    arrays, right padding during a multi-row prefill rolled into left padding by `finalize`.
    """

    step = 256

    def __init__(self, left_padding: list[int], *, bits: int = 8, group_size: int = 64) -> None:
        self.keys: _Parts | None = None
        self.values: _Parts | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding: mx.array | None = None
        self._right_host: list[int] | None = None
        """`_right_padding` as the host had it: `finalize` moves rows by it without a read."""
        self.bits = bits
        self.group_size = group_size

    def _empty_parts(self, rows: int, heads: int, length: int, dim: int, dtype: Any) -> _Parts:
        shape = (rows, heads, length)
        return (
            mx.zeros((*shape, dim * self.bits // 32), dtype=mx.uint32),
            mx.zeros((*shape, dim // self.group_size), dtype=dtype),
            mx.zeros((*shape, dim // self.group_size), dtype=dtype),
        )

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[_Parts, _Parts]:
        prev = self._idx
        rows, heads, steps, k_dim = keys.shape
        if self.keys is None or self.values is None or prev + steps > self.keys[0].shape[2]:
            grown = (self.step + steps - 1) // self.step * self.step
            new_k = self._empty_parts(rows, heads, grown, k_dim, keys.dtype)
            new_v = self._empty_parts(rows, heads, grown, values.shape[3], values.dtype)
            if self.keys is not None and self.values is not None:
                if prev % self.step != 0:
                    self.keys = _slice_seq(self.keys, 0, prev)
                    self.values = _slice_seq(self.values, 0, prev)
                self.keys = _concat_seq(self.keys, new_k)
                self.values = _concat_seq(self.values, new_v)
            else:
                self.keys, self.values = new_k, new_v
        self.offset = self.offset + steps
        self._idx += steps
        quantized_keys = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        quantized_values = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        for part, new in zip(self.keys, quantized_keys, strict=True):
            part[..., prev : self._idx, :] = new
        for part, new in zip(self.values, quantized_values, strict=True):
            part[..., prev : self._idx, :] = new
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[_Parts, _Parts]:
        """The filled part of the keys and values, as `BatchKVCache.keys_and_values` gives
        them (some models, afm7 and gemma3n, read a shared cache through it)."""
        if self.keys is None or self.values is None:
            raise ValueError("the cache holds no tokens yet")
        return _slice_seq(self.keys, 0, self._idx), _slice_seq(self.values, 0, self._idx)

    def prepare(
        self,
        *,
        left_padding: list[int] | None = None,
        lengths: list[int] | None = None,
        right_padding: list[int] | None = None,
    ) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty batch cache")
            padding = mx.array(left_padding)
            self.left_padding = self.left_padding + padding
            self.offset = self.offset - padding
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)
            self._right_host = [int(q) for q in right_padding]

    def finalize(self) -> None:
        """As mlx-lm's: each row rolled right by its right padding, which joins its left
        padding; the rows moved as slices (`moved_right`), not by mlx-lm's gather over
        every row's whole buffer."""
        if self._right_padding is None or self._right_host is None:
            return
        padding, right = self._right_padding, self._right_host
        if self.keys is not None and self.values is not None:
            starts = [0] * len(right)  # the padding moves along: no host copy of it is kept

            def move(part: mx.array) -> mx.array:
                return moved_right(part, starts, self._idx, right)

            (k, s, b), (vk, vs, vb) = self.keys, self.values
            self.keys, self.values = (move(k), move(s), move(b)), (move(vk), move(vs), move(vb))
        self.offset = self.offset - padding
        self.left_padding = self.left_padding + padding
        self._right_padding = self._right_host = None

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, value: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = value

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def make_mask(self, n: int, return_array: bool = False, **kwargs: Any) -> mx.array:
        """The causal mask of `n` new tokens over every row's keys, its padding masked."""
        mask: mx.array = create_causal_mask(
            n, offset=self._idx, left_padding=self.left_padding, **kwargs
        )
        return mask

    def filter(self, batch_indices: Any) -> None:
        """Keep these rows, in this order; drop the padding every remaining row has."""
        if self.keys is not None and self.values is not None:
            self.keys = _take_rows(self.keys, batch_indices)
            self.values = _take_rows(self.values, batch_indices)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shared: int = self.left_padding.min().item() if self.left_padding.size else 0  # type: ignore[assignment]
        if shared > 0:
            if self.keys is not None and self.values is not None:
                self.keys = _slice_seq(self.keys, shared, None)
                self.values = _slice_seq(self.values, shared, None)
            self._idx -= shared
            self.left_padding = self.left_padding - shared

    def extend(self, other: QuantizedBatchKVCache) -> None:
        """Append `other`'s rows, both right-aligned at the longer one's filled length."""
        if other.keys is None and self.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        reference = self.keys if self.keys is not None else other.keys
        reference_values = self.values if self.values is not None else other.values
        assert reference is not None and reference_values is not None
        longest = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)

        def aligned(cache: QuantizedBatchKVCache) -> tuple[_Parts, _Parts, mx.array]:
            keys, values = cache.keys, cache.values
            if keys is None or values is None:
                rows = int(cache.offset.shape[0])
                keys = _zero_rows(reference, rows)
                values = _zero_rows(reference_values, rows)
            left = longest - cache._idx
            right = size - keys[0].shape[2] - left
            if right < 0:
                keys = _slice_seq(keys, 0, right)
                values = _slice_seq(values, 0, right)
                right = 0
            return (
                _pad_seq(keys, left, right),
                _pad_seq(values, left, right),
                cache.left_padding + left,
            )

        mine, theirs = aligned(self), aligned(other)
        self.keys = _concat_rows(mine[0], theirs[0])
        self.values = _concat_rows(mine[1], theirs[1])
        self.left_padding = mx.concatenate([mine[2], theirs[2]])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = longest

    def extract(self, idx: int) -> QuantizedKVRow:
        """Row `idx` as a sequence's own cache (copied out: the batch's arrays can go)."""
        row = QuantizedKVRow(self.group_size, self.bits)
        if self.keys is None or self.values is None:
            return row
        padding: int = self.left_padding[idx].item()  # type: ignore[assignment]  # an int array
        keys = _slice_seq(self.keys, padding, self._idx)
        values = _slice_seq(self.values, padding, self._idx)
        row.keys = tuple(mx.contiguous(p[idx : idx + 1]) for p in keys)
        row.values = tuple(mx.contiguous(p[idx : idx + 1]) for p in values)
        row.offset = self._idx - padding
        return row

    @classmethod
    def merge(cls, caches: list[Any]) -> QuantizedBatchKVCache:
        """Rows (`QuantizedKVRow`s, all made by one engine's `make_cache`: one width and
        group size) as one batch, left-padded to the longest."""
        rows = list(caches)
        bits, group_size = rows[0].bits, rows[0].group_size
        lengths = [int(c.offset) if c.keys is not None else 0 for c in rows]
        longest = max(lengths, default=0)
        padding = [longest - n for n in lengths]
        batch = cls(padding, bits=bits, group_size=group_size)
        if longest == 0:
            return batch
        filled = [c for c in rows if c.keys is not None]
        keys = _merged_parts(filled[0].keys, len(rows), longest)
        values = _merged_parts(filled[0].values, len(rows), longest)
        for i, (pad, row) in enumerate(zip(padding, rows, strict=True)):
            if row.keys is None:
                continue
            for part, source in zip(keys, row.keys, strict=True):
                part[i : i + 1, :, pad:] = source[..., : row.offset, :]
            for part, source in zip(values, row.values, strict=True):
                part[i : i + 1, :, pad:] = source[..., : row.offset, :]
        batch.keys, batch.values = keys, values
        batch.offset = batch.offset + longest
        batch._idx = longest
        return batch

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(p.nbytes for p in (*self.keys, *self.values))


def _concat_seq(a: _Parts, b: _Parts) -> _Parts:
    return (
        mx.concatenate([a[0], b[0]], axis=2),
        mx.concatenate([a[1], b[1]], axis=2),
        mx.concatenate([a[2], b[2]], axis=2),
    )


def _concat_rows(a: _Parts, b: _Parts) -> _Parts:
    return (
        mx.concatenate([a[0], b[0]]),
        mx.concatenate([a[1], b[1]]),
        mx.concatenate([a[2], b[2]]),
    )


def _take_rows(parts: _Parts, rows: Any) -> _Parts:
    return (parts[0][rows], parts[1][rows], parts[2][rows])


def _zero_rows(reference: _Parts, rows: int) -> _Parts:
    """Empty (length 0) parts shaped like `reference`'s, for `rows` rows."""
    return (
        mx.zeros((rows, *reference[0].shape[1:2], 0, reference[0].shape[3]), reference[0].dtype),
        mx.zeros((rows, *reference[1].shape[1:2], 0, reference[1].shape[3]), reference[1].dtype),
        mx.zeros((rows, *reference[2].shape[1:2], 0, reference[2].shape[3]), reference[2].dtype),
    )


def _merged_parts(reference: _Parts, rows: int, length: int) -> _Parts:
    """Zeroed parts shaped like `reference`'s, for `rows` rows of `length` tokens."""
    heads = reference[0].shape[1]
    return (
        mx.zeros((rows, heads, length, reference[0].shape[3]), reference[0].dtype),
        mx.zeros((rows, heads, length, reference[1].shape[3]), reference[1].dtype),
        mx.zeros((rows, heads, length, reference[2].shape[3]), reference[2].dtype),
    )
