"""A decode step's heads made ready by one kernel (`_decode_prelude.py`).

The kernel is CUDA's: where CUDA runs, a served block's decode step must give what
mlx-lm's path gives, through the real kernel. Everywhere: the blocks it serves are the ones
it can (fused llama and qwen2 attention with a whole-head RoPE, by base or by frequencies),
and a block given the path takes it exactly where it may (a one-token query, a lone
sequence's cache with a write slot, a running batch's only where asked, no adapter around
the projections) and computes there what mlx-lm's code does
(the kernel stood in for by MLX's own operations), writing the cache as mlx-lm's update
does, for a lone sequence's cache and a running batch's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import llama, qwen2, qwen3

from mlx_nursery.engine import _decode_prelude, _kv_append
from mlx_nursery.engine._backend import on_cuda
from mlx_nursery.engine._decode_prelude import Plan, install, plan_for
from mlx_nursery.engine._ragged import RaggedBatchKVCache, ragged_rows
from mlx_nursery.engine._upstream import make_prompt_cache
from mlx_nursery.models._fusing import fuse_projections

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_type": "llama3"}  # fmt: skip


def model_of(module: Any, *, fused: bool = True, **config: Any) -> Any:
    """A small random-weight mlx-lm model of `module`'s architecture, float32."""
    args = module.ModelArgs(
        model_type=module.__name__.rsplit(".", 1)[-1], hidden_size=64, num_hidden_layers=2,
        intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, vocab_size=96, **config,
    )  # fmt: skip
    mx.random.seed(3)
    model = module.Model(args)
    mx.eval(model.parameters())
    if fused:
        fuse_projections(model)
    return model


def blocks(model: Any) -> list[Any]:
    return [layer.self_attn for layer in model.layers]


def test_the_blocks_served_are_fused_ones_with_a_whole_head_rope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scaled = plan_for(blocks(model_of(llama, rope_scaling=LLAMA3))[0])
    assert scaled is not None and scaled.with_freqs and scaled.scale == 1.0
    assert (scaled.q_heads, scaled.kv_heads, scaled.dim) == (4, 2, 16)
    assert len(scaled.frequencies) == 8
    linear = plan_for(blocks(model_of(llama, rope_scaling={"type": "linear", "factor": 4.0}))[0])
    assert linear is not None and not linear.with_freqs and linear.scale == 0.25
    based = plan_for(blocks(model_of(qwen2, rope_theta=1e6))[0])
    assert based is not None and not based.with_freqs
    assert based.frequencies == pytest.approx((19.931568,))  # log2 of the base
    assert plan_for(blocks(model_of(llama, fused=False))[0]) is None  # mlx-lm's own layers
    assert (
        plan_for(
            blocks(
                model_of(
                    qwen3,
                    head_dim=16,
                    tie_word_embeddings=True,
                    max_position_embeddings=64,
                    rope_theta=1e6,
                )
            )[0]
        )
        is None
    )
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert plan_for(blocks(model_of(llama, rope_scaling=yarn))[0]) is None
    model = model_of(llama, rope_scaling=LLAMA3)
    if not on_cuda():
        assert install(model) == 0  # never on another backend
    monkeypatch.setattr(_decode_prelude, "on_cuda", lambda: True)
    assert install(model) == 2 and install(model) == 2  # idempotent
    first, second = blocks(model)
    assert first._nursery_plan is second._nursery_plan  # one plan, checked once
    assert type(first).__name__ == "Attention" and type(first) is not llama.Attention


def stand_in(qkv: mx.array, cache: Any, index: int, plan: Plan) -> mx.array:
    """The kernel's work in MLX's operations: mlx-lm's rotation, and its slice update of the
    cache's buffers (as the kernel's in-place write leaves them)."""
    rope = _decode_prelude._references[plan]
    batch, dim = qkv.shape[0], plan.dim
    q, k, v = (
        part.reshape(batch, 1, -1, dim).transpose(0, 2, 1, 3)
        for part in mx.split(qkv, [plan.q_heads * dim, (plan.q_heads + plan.kv_heads) * dim], -1)
    )
    offset = cache.offset
    cache.keys[..., index : index + 1, :] = rope(k, offset=offset)
    cache.values[..., index : index + 1, :] = v
    rotated: mx.array = rope(q, offset=offset)
    return rotated


@pytest.fixture
def through_stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Blocks served here, the kernel stood in for; yields the calls it took."""
    calls: list[int] = []

    def recorded(*args: Any) -> mx.array:
        calls.append(args[0].shape[0])
        return stand_in(*args)

    monkeypatch.setattr(_decode_prelude, "on_cuda", lambda: True)
    monkeypatch.setattr(_decode_prelude, "prelude", recorded)
    monkeypatch.setattr(_decode_prelude, "checked", lambda plan, dtype: True)
    yield calls


def prefilled(model: Any, prompts: list[list[int]]) -> list[list[Any]]:
    """Each prompt's cache (MLX's own writes), as the engine makes them."""
    caches = []
    for prompt in prompts:
        cache = ragged_rows(make_prompt_cache(model))
        model(mx.array([prompt]), cache=cache)
        caches.append(cache)
    return caches


def decoded(model: Any, form: str, in_place: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Logits of two decode steps after the prompts, and the caches' keys after them."""
    monkeypatch.setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: False)
    prompts = [[5, 9, 2, 7, 1], [3, 8], [4, 4, 6, 1, 2, 9, 9, 3]]
    rows = prefilled(model, prompts if form == "batch" else prompts[:1])
    if form == "batch":
        cache: list[Any] = [RaggedBatchKVCache.merge([r[i] for r in rows]) for i in range(2)]
    else:
        (cache,) = rows
    monkeypatch.setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: in_place)
    tokens = mx.array([[11], [12], [13]][: len(rows)])
    logits = [model(tokens, cache=cache)]
    logits.append(model(tokens + 1, cache=cache))
    keys = [layer.keys_and_values()[0] for layer in cache]
    mx.eval(logits, keys)
    return logits, keys


@pytest.mark.parametrize("form", ["sequence", "batch"])
@pytest.mark.parametrize(
    ("module", "config"), [(llama, {"rope_scaling": LLAMA3}), (qwen2, {"rope_theta": 1e6})]
)
def test_a_decode_step_through_the_path_is_mlx_lms(
    module: Any,
    config: dict[str, Any],
    form: str,
    through_stand_in: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = model_of(module, **config)
    install(model)
    monkeypatch.setattr(_decode_prelude, "BATCHES", form == "batch")  # off by default
    want_logits, want_keys = decoded(model, form, False, monkeypatch)  # no write slot
    assert through_stand_in == []
    got_logits, got_keys = decoded(model, form, True, monkeypatch)
    rows = 3 if form == "batch" else 1
    assert through_stand_in == [rows] * 4  # two layers, two steps
    for got, want in zip(got_logits + got_keys, want_logits + want_keys, strict=True):
        assert got.shape == want.shape
        assert mx.allclose(got, want, atol=1e-5).item()


def test_a_running_batch_keeps_mlx_lms_path_unless_asked(
    through_stand_in: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_of(llama, rope_scaling=LLAMA3)
    install(model)
    monkeypatch.setattr(_kv_append, "append_in_place", lambda *a: mx.zeros((1,), mx.int32))
    decoded(model, "batch", True, monkeypatch)  # mlx-lm's path, its write in place
    assert through_stand_in == []
    monkeypatch.setattr(_decode_prelude, "BATCHES", True)
    decoded(model, "batch", True, monkeypatch)
    assert through_stand_in == [3] * 4


def test_a_block_with_adapters_or_a_longer_query_keeps_mlx_lms_path(
    through_stand_in: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_of(llama, rope_scaling=LLAMA3)
    install(model)
    monkeypatch.setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: True)
    monkeypatch.setattr(_kv_append, "append_in_place", lambda *a: mx.zeros((1,), mx.int32))
    (cache,) = prefilled(model, [[1, 2, 3]])
    model(mx.array([[4, 5]]), cache=cache)  # two tokens: a chunk, not a decode step
    assert through_stand_in == []
    wrapped: Callable[[mx.array], mx.array] = nn.Linear(64, 64)
    blocks(model)[0].q_proj = wrapped  # as a LoRA adapter wraps its part
    model(mx.array([[6]]), cache=cache)
    assert through_stand_in == [1]  # the second layer only


@pytest.mark.skipif(not on_cuda(), reason="the kernel is CUDA's")
@pytest.mark.parametrize("form", ["sequence", "batch"])
@pytest.mark.parametrize(
    ("module", "config", "dtype"),
    [
        (llama, {"rope_scaling": LLAMA3}, mx.bfloat16),
        (qwen2, {"rope_theta": 1e6, "rope_traditional": True}, mx.float32),
    ],
)
def test_the_kernel_gives_mlx_lms_decode_step(
    module: Any,
    config: dict[str, Any],
    dtype: mx.Dtype,
    form: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = model_of(module, **config)
    model.set_dtype(dtype)
    assert install(model) == 2
    plan = blocks(model)[0]._nursery_plan
    assert _decode_prelude.checked(plan, dtype)  # against mlx-lm's path, on small inputs
    calls: list[int] = []
    kernel = _decode_prelude.prelude

    def recorded(*args: Any) -> mx.array:
        calls.append(1)
        return kernel(*args)

    monkeypatch.setattr(_decode_prelude, "prelude", recorded)
    monkeypatch.setattr(_decode_prelude, "BATCHES", True)  # the kernel where it may serve
    want_logits, want_keys = decoded(model, form, False, monkeypatch)
    assert calls == []
    got_logits, got_keys = decoded(model, form, True, monkeypatch)
    assert len(calls) == 4  # the kernel passed its check and served both layers, both steps
    tolerance = 1e-4 if dtype == mx.float32 else 5e-2
    for got, want in zip(got_logits + got_keys, want_logits + want_keys, strict=True):
        assert mx.allclose(got, want, atol=tolerance, rtol=tolerance).item()
