"""Attention of a query of several tokens over one sequence's cache, laid out for cuBLAS.

With cuDNN attention off (the server's default on CUDA, decisions/0004), MLX's CUDA backend
takes a query of up to 3 tokens in its vector kernel and anything longer (a prompt's prefill
chunk, the tail of a prompt after a prefix-cache hit, a speculative verify) through its
composed fallback: two matrix products with a select under the mask and a softmax between.
That fallback keeps a key-value head's query heads apart in a broadcast batch dimension,
multiplies over exactly the keys the cache holds (any count, so that cuBLAS must take its
kernels for unaligned operands), and spends most of a long chunk's time in the select and
the softmax. `sequence_attention` computes the same attention laid out for cuBLAS: a
key-value head's query heads folded into the rows of one product (one batch dimension, no
broadcast), the keys read from the cache's buffer (which holds more than it serves) up to a
multiple of `_ALIGN`, the mask hiding the padding (a padded key lies after every query's
position, so it weighs exactly zero), and on CUDA one kernel of ours for the mask and the
softmax (`_masked_softmax.py`); elsewhere MLX's select and softmax (decisions/0054).

A batch's masked queries (prompts prefilled together, a batch's verify) take the same
fallback, mask and all, and come here too, their mask widened over the padding.
`_decode_attention.routed` sends it what `takes` accepts, on CUDA with cuDNN attention off;
everything else goes to mlx-lm's function. Engine thread only (the latest forward's mask
and the kernel's inputs are kept per engine thread, as `_ragged`'s shared arrays are).
"""

from __future__ import annotations

import threading
from typing import Any

import mlx.core as mx

from ._backend import on_cuda
from ._masked_softmax import masked_softmax, usable
from ._row_cache import is_plain_kv
from ._upstream import BatchKVCache

_ALIGN = 16
"""Keys are read up to a multiple of this many: 32 bytes of a 2-byte type, which cuBLAS's
aligned kernels need of a leading dimension."""

MAX_SCORES_BYTES = 1 << 30
"""A query's scores are made in arrays of this many bytes at most (and its weights after the
softmax as many again): a query whose scores would take more is computed in slices of its
positions, each over the keys it sees. A prefill chunk's scores are rows x heads x length x
keys: a chunk of several prompts deep into long contexts would otherwise need one array
larger than the device's room beside the KV budget (engine/_memory.py), whatever the chunk
size. Slices free their arrays as the device runs them; a slice this large keeps its
products as efficient as the whole query's."""

MIN_QUERY = 4
"""On one sequence's cache, shorter queries take MLX's vector kernel (a fused attention),
which this does not beat. A batch's (masked) queries of any length above one take the
composed fallback, so from two tokens on they come here."""


class _Masks(threading.local):
    """The latest forward's mask, per engine thread: each engine runs its model on a thread
    of its own, with MLX streams of that thread, and the mask is lazy. Every layer of a
    forward asks for the same one."""

    def __init__(self) -> None:
        self.causal: dict[tuple[int, int, int], mx.array] = {}
        self.kernel: dict[
            tuple[float, int, int, int | None, int, int],
            tuple[Any, tuple[mx.array, mx.array | None, mx.array | None]],
        ] = {}
        """The masked softmax's inputs (`_kernel_inputs`) for each slice of the query, with
        the mask they came from."""
        self.padded: dict[tuple[int, int], tuple[mx.array, mx.array]] = {}
        """A batch's mask (mlx-lm's, one array for every layer) by identity and padded
        length: the mask itself (which keeps its identity valid) and its padded form."""


_masks = _Masks()


def takes(
    queries: mx.array, keys: mx.array, values: mx.array, cache: Any, mask: Any, sinks: Any
) -> bool:
    """Whether `sequence_attention` serves this call of mlx-lm's attention (`keys` and
    `values` are what the model passes: the cache's own, as its update returned them): a
    query of `MIN_QUERY` or more tokens, no attention sinks, and either a plain KV cache
    (mlx-lm's `KVCache`, whose buffer grows in steps and is read from its start) with a
    causal mask, or a batch's KV cache (`BatchKVCache`: prompts prefilled together, a
    batch's verify) with mlx-lm's boolean mask over its keys. The keys and values must be
    the buffer's own layout (a model that tiles or reshapes them after the update, or a
    quantized cache's tuples, keeps mlx-lm's attention)."""
    length = queries.shape[2]
    if length < 2 or sinks is not None or not same_layout(queries, keys, values, cache):
        return False  # a decode step's query first: the test every layer of it meets
    if isinstance(cache, BatchKVCache):
        return (
            isinstance(mask, mx.array)
            and mask.dtype == mx.bool_
            and mask.shape == (queries.shape[0], 1, queries.shape[2], keys.shape[2])
            and keys.shape[2] == cache._idx
        )
    return (
        length >= MIN_QUERY
        and is_plain_kv(cache)
        and isinstance(mask, str)
        and mask == "causal"
        and keys.shape[2] == cache.offset
    )


def same_layout(queries: mx.array, keys: mx.array, values: mx.array, cache: Any) -> bool:
    """`keys` and `values` are slices of `cache`'s own buffers along the sequence (same
    batch, heads, width and dtype), and each key-value head serves a whole group of query
    heads: what a kernel that reads the buffers, not the arrays passed, needs."""
    buffers = getattr(cache, "keys", None), getattr(cache, "values", None)
    if not all(isinstance(b, mx.array) and b.ndim == 4 for b in buffers):
        return False  # none yet, or a quantized cache's (data, scales, biases)
    key_buffer, value_buffer = buffers
    assert key_buffer is not None and value_buffer is not None
    q, k, v = queries.shape, keys.shape, values.shape
    kb, vb = key_buffer.shape, value_buffer.shape
    return (
        k[0] == kb[0] == q[0]
        and k[1] == kb[1]
        and k[3] == kb[3] == q[3]
        and v[0] == vb[0]
        and v[1] == vb[1]
        and v[3] == vb[3]
        and q[1] % k[1] == 0
        and keys.dtype == key_buffer.dtype == queries.dtype
        and values.dtype == value_buffer.dtype
    )


def sequence_attention(
    queries: mx.array, cache: Any, scale: float, mask: mx.array | str = "causal"
) -> mx.array:
    """Attention of `queries` (B, Hq, L, D: the last L positions written to `cache`, after
    this forward's update) over the cache's keys, under `mask` ("causal" on a plain cache;
    mlx-lm's boolean mask (B, 1, L, keys) on a batch's): what mlx-lm's
    `scaled_dot_product_attention` computes, in MLX operations laid out for cuBLAS (module
    docstring), in slices of the query where its scores would pass `MAX_SCORES_BYTES`. Only
    for calls `takes` accepts. Lazy, as any MLX operation."""
    batch, heads, length, _ = queries.shape
    total: int = cache._idx if isinstance(cache, BatchKVCache) else cache.offset
    position_bytes = batch * heads * _aligned(total, cache.keys) * queries.dtype.size
    slices = max(1, -(-position_bytes * length // MAX_SCORES_BYTES))
    if slices == 1:
        return _attend(queries, cache, scale, mask, total, 0, length)
    step = -(-length // slices)
    return mx.concatenate(
        [
            _attend(queries[:, :, start : start + step], cache, scale, mask, total, start, length)
            for start in range(0, length, step)
        ],
        axis=2,
    )


def _aligned(total: int, buffer: mx.array) -> int:
    """The keys read for `total` written: up to a multiple of `_ALIGN`, within `buffer`."""
    return min(-(-total // _ALIGN) * _ALIGN, buffer.shape[2])


def _attend(
    queries: mx.array,
    cache: Any,
    scale: float,
    mask: mx.array | str,
    total: int,
    start: int,
    length: int,
) -> mx.array:
    """`sequence_attention` of the query's positions `start` to `start` + its length, of
    `length` in all, over the `total` keys written. A causal slice reads the keys up to its
    last position only."""
    batch, heads, count, dim = queries.shape
    stop = start + count
    keys_buffer, values_buffer = cache.keys, cache.values
    kv_heads = keys_buffer.shape[1]
    rep = heads // kv_heads
    seen = total - (length - stop) if isinstance(mask, str) else total
    """The keys the slice's last position sees (a batch's mask: all those written)."""
    padded = _aligned(seen, keys_buffer)
    keys = keys_buffer[..., :padded, :]
    values = values_buffer[..., :padded, :]
    if on_cuda() and usable(queries.dtype):  # one kernel: the mask, the scale, the softmax
        if queries.dtype == mx.float16:  # an unscaled product could pass float16's range
            queries, scale = queries * mx.array(scale, mx.float16), 1.0
        folded = queries.reshape(batch, kv_heads, rep * count, dim)
        scores = (folded @ keys.swapaxes(-1, -2)).reshape(batch, heads, count, padded)
        extras = _kernel_inputs(scale, total, length, mask, start, stop)
        weights = masked_softmax(scores, extras[0], total=extras[1], mask=extras[2])
    else:
        dtype = queries.dtype
        folded = (queries * mx.array(scale, dtype)).reshape(batch, kv_heads, rep * count, dim)
        scores = (folded @ keys.swapaxes(-1, -2)).reshape(batch, kv_heads, rep, count, padded)
        whole = _aligned(total, keys_buffer)
        visible = _causal(length, total, whole) if isinstance(mask, str) else _padded(mask, whole)
        if count < length:  # the slice's rows, and the keys they see
            visible = visible[..., start:stop, :padded]
        scores = mx.where(visible, scores, mx.array(mx.finfo(dtype).min, dtype))
        weights = mx.softmax(scores, axis=-1, precise=True)
    weights = weights.reshape(batch, kv_heads, rep * count, padded)
    out: mx.array = (weights @ values).reshape(batch, heads, count, dim)
    return out


def _kernel_inputs(
    scale: float, total: int, length: int, mask: mx.array | str, start: int, stop: int
) -> tuple[mx.array, mx.array | None, mx.array | None]:
    """The masked softmax's scale, and its key count (causal: the keys the slice's last
    position sees) or mask rows `start` to `stop` (B, rows, keys), made once per forward
    and slice of a query of `length` over `total` keys."""
    key = (scale, total, length, None if isinstance(mask, str) else id(mask), start, stop)
    made = _masks.kernel
    held = made.get(key)
    if held is None:
        if start == 0:
            made.clear()  # only the latest forward's layers share them
        scale_array = mx.array([scale], dtype=mx.float32)
        if isinstance(mask, str):
            seen = total - (length - stop)
            held = (mask, (scale_array, mx.array([seen], dtype=mx.int32), None))
        else:
            squeezed = mask.reshape(mask.shape[0], mask.shape[2], mask.shape[3])
            rows = squeezed if (start, stop) == (0, length) else squeezed[:, start:stop]
            held = (mask, (scale_array, None, rows))
        made[key] = held
    return held[1]


def _causal(length: int, total: int, padded: int) -> mx.array:
    """Which keys each of the last `length` of `total` positions sees (L, padded): its own and
    those before it; made once per forward."""
    key = (length, total, padded)
    made = _masks.causal
    mask = made.get(key)
    if mask is None:
        made.clear()  # only the latest forward's layers share it
        positions = mx.arange(total - length, total)[:, None]
        mask = made[key] = mx.arange(padded)[None, :] <= positions
    return mask


def _padded(mask: mx.array, padded: int) -> mx.array:
    """mlx-lm's batch mask (B, 1, L, keys) with the padded keys hidden, shaped to broadcast
    over the folded scores (B, 1, 1, L, padded); made once per forward."""
    key = (id(mask), padded)
    made = _masks.padded
    held = made.get(key)
    if held is None:
        made.clear()  # only the latest forward's layers share it
        extra = padded - mask.shape[-1]
        wide = (
            mx.concatenate([mask, mx.zeros((*mask.shape[:-1], extra), mx.bool_)], axis=-1)
            if extra
            else mask
        )
        held = made[key] = (mask, mx.expand_dims(wide, 2))
    return held[1]
