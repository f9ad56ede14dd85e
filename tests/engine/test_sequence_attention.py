"""A query of several tokens in the layout for cuBLAS (`_sequence_attention.py`).

It must compute what mlx-lm's attention computes for every call the router gives it: a causal
query on one sequence's cache (a prefill chunk from the start, a prompt's tail after a prefix
of any length, a verify), and a batch's masked query (prompts prefilled together with left
padding, a batch's verify), whatever the cache's buffer leaves for padding. MLX's own
attention is the reference, on whatever device runs the test; the router must send it only
those calls, and none where cuDNN attention is on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

from mlx_nursery.engine import EngineConfig, Speculation, _sequence_attention, open_engine
from mlx_nursery.engine._decode_attention import routed
from mlx_nursery.engine._kv_quant import QuantizedKVRow
from mlx_nursery.engine._ragged import RaggedBatchKVCache, RowKVCache
from mlx_nursery.engine._sequence_attention import sequence_attention, takes
from tests.helpers import collect, collect_all, request


def normal(seed: int, *shape: int, dtype: mx.Dtype = mx.float32) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(dtype)


def sequence(prior: int, length: int, kv_heads: int, dim: int, dtype: mx.Dtype) -> Any:
    cache = KVCache()
    if prior:
        cache.update_and_fetch(
            normal(1, 1, kv_heads, prior, dim, dtype=dtype),
            normal(2, 1, kv_heads, prior, dim, dtype=dtype),
        )
    keys, values = cache.update_and_fetch(
        normal(3, 1, kv_heads, length, dim, dtype=dtype),
        normal(4, 1, kv_heads, length, dim, dtype=dtype),
    )
    return cache, keys, values


def batch(
    priors: list[int], length: int, kv_heads: int, dim: int, cls: type = RaggedBatchKVCache
) -> Any:
    rows = []
    for i, prior in enumerate(priors):
        row = RowKVCache() if cls is RaggedBatchKVCache else KVCache()
        if prior:
            row.update_and_fetch(
                normal(10 + i, 1, kv_heads, prior, dim), normal(50 + i, 1, kv_heads, prior, dim)
            )
        rows.append(row)
    cache = cls.merge(rows)
    mask = cache.make_mask(length)  # before the update, as mlx-lm makes it
    keys, values = cache.update_and_fetch(
        normal(5, len(priors), kv_heads, length, dim), normal(6, len(priors), kv_heads, length, dim)
    )
    return cache, keys, values, mask


def close(got: mx.array, want: mx.array, dtype: mx.Dtype) -> bool:
    # On CUDA MLX's float32 products are TF32 (ten bits of mantissa), and MLX's own attention
    # takes a vector kernel in float32 for short queries where this takes the products
    tf32 = mx.default_device().type == mx.gpu and not mx.metal.is_available()
    tolerance = (3e-3 if tf32 else 1e-5) if dtype == mx.float32 else 2e-2
    return bool(mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=tolerance))


@pytest.mark.parametrize(
    ("prior", "length", "heads", "kv_heads", "dim", "dtype"),
    [
        (0, 4, 4, 4, 16, mx.float32),  # a first chunk, no grouped heads
        (0, 64, 8, 2, 32, mx.float32),  # a first chunk that fills the buffer's step exactly
        (13, 5, 6, 2, 16, mx.float32),  # a verify after an odd prefix
        (250, 9, 8, 1, 32, mx.float16),  # past the buffer's step: padding from its growth
        (300, 256, 4, 2, 16, mx.float32),  # a later chunk: no room to pad in the buffer
        (517, 43, 32, 8, 64, mx.bfloat16),  # a prompt's tail after a prefix-cache hit
    ],
)
def test_a_sequences_query_gets_mlxs_causal_attention(
    prior: int, length: int, heads: int, kv_heads: int, dim: int, dtype: mx.Dtype
) -> None:
    cache, keys, values = sequence(prior, length, kv_heads, dim, dtype)
    queries = normal(7, 1, heads, length, dim, dtype=dtype)
    assert takes(queries, keys, values, cache, "causal", None)
    want = mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=dim**-0.5, mask="causal"
    )
    assert close(sequence_attention(queries, cache, dim**-0.5), want, dtype)


@pytest.mark.parametrize("cls", [RaggedBatchKVCache, BatchKVCache])
@pytest.mark.parametrize(
    ("priors", "length", "heads", "kv_heads"),
    [
        ([0, 0, 0], 12, 4, 2),  # prompts' first chunk together
        ([30, 7, 19], 9, 8, 2),  # rows of different lengths: left padding masked
        ([590, 3, 260, 77], 2, 6, 3),  # a batch's verify of one draft a row
    ],
)
def test_a_batchs_masked_query_gets_mlxs_attention(
    cls: type, priors: list[int], length: int, heads: int, kv_heads: int
) -> None:
    cache, keys, values, mask = batch(priors, length, kv_heads, 16, cls)
    queries = normal(8, len(priors), heads, length, 16)
    assert takes(queries, keys, values, cache, mask, None)
    want = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=0.25, mask=mask)
    assert close(sequence_attention(queries, cache, 0.25, mask), want, mx.float32)


@pytest.mark.parametrize(
    ("priors", "length", "slices"),
    [
        ([40], 30, 3),  # a lone prompt's chunk: each slice reads the keys up to its last
        ([40], 29, 4),  # a length the slices do not divide: the last one shorter
        ([30, 7, 19], 12, 3),  # prompts together: each slice takes its rows of the mask
    ],
)
def test_a_query_whose_scores_pass_the_bound_is_computed_in_slices_alike(
    priors: list[int], length: int, slices: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scores past `MAX_SCORES_BYTES` are computed a slice of the query's positions at a
    time (so that a chunk of long prompts holds a bounded share of memory at once), with
    the same result as MLX's attention of the whole query."""
    heads, kv_heads, dim = 4, 2, 16
    if len(priors) == 1:
        cache, keys, values = sequence(priors[0], length, kv_heads, dim, mx.float32)
        mask: Any = "causal"
    else:
        cache, keys, values, mask = batch(priors, length, kv_heads, dim)
    queries = normal(9, len(priors), heads, length, dim)
    assert takes(queries, keys, values, cache, mask, None)
    want = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=dim**-0.5, mask=mask)
    total = cache._idx if len(priors) > 1 else cache.offset
    keys_read = min(-(-total // 16) * 16, cache.keys.shape[2])
    position_bytes = len(priors) * heads * keys_read * 4
    # the bound that gives `slices` slices of ceil(length / slices) positions
    monkeypatch.setattr(
        _sequence_attention, "MAX_SCORES_BYTES", -(-position_bytes * length // slices)
    )
    attended: list[tuple[int, int]] = []
    attend = _sequence_attention._attend

    def counted(queries: mx.array, *args: Any) -> mx.array:
        attended.append((args[4], queries.shape[2]))
        return attend(queries, *args)

    monkeypatch.setattr(_sequence_attention, "_attend", counted)
    got = sequence_attention(queries, cache, dim**-0.5, mask)
    step = -(-length // slices)
    assert attended == [(start, min(step, length - start)) for start in range(0, length, step)]
    assert len(attended) > 1
    assert close(got, want, mx.float32)


def test_the_router_sends_it_only_what_it_serves() -> None:
    calls: list[int] = []

    def original(q: mx.array, k: mx.array, v: mx.array, **kwargs: Any) -> mx.array:
        calls.append(q.shape[2])
        return q

    attend = routed(original)
    plain, keys, values = sequence(20, 4, 2, 16, mx.float32)
    q4 = normal(9, 1, 4, 4, 16)
    assert attend(q4, keys, values, cache=plain, scale=0.25, mask="causal") is not q4
    assert calls == []
    short, k3, v3 = sequence(20, 3, 2, 16, mx.float32)  # MLX's vector kernel takes it
    q3 = normal(9, 1, 4, 3, 16)
    assert attend(q3, k3, v3, cache=short, scale=0.25, mask="causal") is q3
    sinks = mx.zeros((4,))
    assert attend(q4, keys, values, cache=plain, scale=0.25, mask="causal", sinks=sinks) is q4
    # A quantized cache holds (data, scales, biases): mlx-lm's attention reads it, never
    # the buffers, whether a lone sequence's or a batch's.
    quantized = QuantizedKVCache(group_size=32, bits=8)
    qk, qv = quantized.update_and_fetch(normal(1, 1, 2, 24, 32), normal(2, 1, 2, 24, 32))
    assert attend(q4, qk, qv, cache=quantized, scale=0.25, mask="causal") is q4
    rows_q = QuantizedKVRow.merge([QuantizedKVRow(group_size=32, bits=8) for _ in range(2)])
    bqk, bqv = rows_q.update_and_fetch(normal(3, 2, 2, 5, 32), normal(4, 2, 2, 5, 32))
    q2 = normal(9, 2, 4, 2, 16)
    assert (
        attend(q2, bqk, bqv, cache=rows_q, scale=0.25, mask=mx.ones((2, 1, 2, 5), mx.bool_)) is q2
    )
    # A model that tiles its keys over the query heads after the update (mlx-lm's plamo)
    # pairs heads differently from the buffer's grouping: its own arrays are attended.
    tiled_k, tiled_v = mx.tile(keys, [1, 2, 1, 1]), mx.tile(values, [1, 2, 1, 1])
    assert attend(q4, tiled_k, tiled_v, cache=plain, scale=0.25, mask="causal") is q4
    rows, bk, bv, mask = batch([5, 9], 2, 2, 16)
    assert attend(q2, bk, bv, cache=rows, scale=0.25, mask=mask) is not q2
    assert calls == [3, 4, 4, 2, 4]
    with_cudnn = routed(original, sequences=False)
    assert with_cudnn(q4, keys, values, cache=plain, scale=0.25, mask="causal") is q4
    assert with_cudnn(q2, bk, bv, cache=rows, scale=0.25, mask=mask) is q2
    assert calls == [3, 4, 4, 2, 4, 4, 2]


def _masked_softmax_in_mlx(
    scores: mx.array, scale: mx.array, *, total: Any = None, mask: Any = None
) -> mx.array:
    """What the CUDA kernel computes, in MLX operations: the self-check's subject here."""
    _, _, length, keys = scores.shape
    if mask is None:
        written = int(total.item())
        visible = mx.arange(keys)[None, :] <= mx.arange(written - length, written)[:, None]
    else:
        visible = mx.pad(mask, [(0, 0), (0, 0), (0, keys - mask.shape[2])])[:, None]
    logits = mx.where(visible, scores.astype(mx.float32) * scale, -mx.inf)
    return mx.softmax(logits, axis=-1).astype(scores.dtype)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_the_kernels_self_check_passes_a_masked_softmax_and_refuses_others(
    monkeypatch: pytest.MonkeyPatch, dtype: mx.Dtype
) -> None:
    """The CUDA kernel is checked on its first use per dtype, and MLX's softmax serves where
    it fails (here, with no CUDA, it fails to build). The check itself must pass what the
    kernel should compute and refuse a softmax that ignores the mask."""
    from mlx_nursery.engine import _masked_softmax

    assert not _masked_softmax._self_check(dtype)  # no CUDA back-end here
    monkeypatch.setattr(_masked_softmax, "masked_softmax", _masked_softmax_in_mlx)
    assert _masked_softmax._self_check(dtype)

    def unmasked(scores: mx.array, scale: mx.array, **_: Any) -> mx.array:
        return mx.softmax(scores.astype(mx.float32) * scale, axis=-1).astype(scores.dtype)

    monkeypatch.setattr(_masked_softmax, "masked_softmax", unmasked)
    assert not _masked_softmax._self_check(dtype)


PROMPTS = [
    "hello",
    "A longer prompt, so that the batch's rows are left-padded to it. " * 5,
    "def f(x):\n    return x + 1\n" * 4,  # repeats: prompt lookup finds drafts
]


async def _served(config: EngineConfig) -> list[list[int]]:
    """Each prompt's greedy tokens: alone (a lone sequence's chunks and verifies), then all
    at once (a batch's prompts and steps)."""
    async with open_engine(config) as engine:
        asked = [request(engine, text, max_tokens=12, ignore_eos=True) for text in PROMPTS]
        lone = [await collect(engine, r) for r in asked]
        together = await collect_all(engine, asked)
    return [run.tokens for run in [*lone, *together]]


async def test_the_engine_serves_the_same_tokens_with_its_attention_routed(
    small_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router installed as on CUDA (its sequence attention taking MLX's select and softmax
    here): prompts prefilled alone and together, speculation's verifies and a quantized
    cache give the tokens the unrouted engine gives, and every kind of call it must leave
    alone (decode steps, quantized caches) reaches mlx-lm's attention unharmed."""
    import mlx_lm.models.qwen3 as qwen3  # the small preset's architecture

    from mlx_nursery.engine import _decode_attention

    base = EngineConfig(
        small_model, max_concurrency=8, prefill_step_size=32, warmup=False, ragged_attention=False
    )
    drafting = Speculation(method="ngram", tokens=4, adaptive=False)
    plain = await _served(base)
    speculating = await _served(attrs.evolve(base, speculation=drafting))
    quantized = await _served(attrs.evolve(base, kv_bits=8, kv_group_size=32))

    served = []
    original = _decode_attention.sequence_attention

    def counted(*args: Any, **kwargs: Any) -> mx.array:
        served.append(args[0].shape[2])
        return original(*args, **kwargs)

    monkeypatch.setattr(qwen3, "scaled_dot_product_attention", qwen3.scaled_dot_product_attention)
    monkeypatch.setattr(_decode_attention, "available", lambda: True)
    monkeypatch.setattr(_decode_attention, "sequence_attention", counted)
    assert await _served(base) == plain
    assert served and min(served) >= 4  # lone chunks, and the batch's prompts
    served.clear()
    assert await _served(attrs.evolve(base, speculation=drafting)) == speculating
    assert served  # verifies among them
    served.clear()
    assert await _served(attrs.evolve(base, kv_bits=8, kv_group_size=32)) == quantized
    assert served == []
