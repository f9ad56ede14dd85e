"""Each residual add and the RMSNorm after it in one kernel (`_fused_norm.py`).

The kernel is CUDA's: where CUDA runs it must give MLX's add and RMSNorm. Everywhere: the
blocks it serves are mlx-lm's llama, qwen2 and qwen3 `TransformerBlock`s, and a served
model's forwards (a prompt, then decode steps on its cache) give exactly what mlx-lm's give,
MLX's two operations standing in for the kernel, with the add and norm fused twice a layer
but once in the first (whose input is the embeddings).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import gemma, llama, qwen2, qwen3

from mlx_nursery.engine import _fused_norm
from mlx_nursery.engine._backend import on_cuda
from mlx_nursery.engine._fused_norm import add_rms_norm, install, usable
from mlx_nursery.engine._upstream import make_prompt_cache
from mlx_nursery.models._fusing import fuse_projections

LAYERS = 3


def model_of(module: Any) -> Any:
    """A small random-weight mlx-lm model of `module`'s architecture, float32, fused."""
    args = module.ModelArgs(
        model_type=module.__name__.rsplit(".", 1)[-1], hidden_size=64,
        num_hidden_layers=LAYERS, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=96,
        **({"head_dim": 16, "rope_theta": 1e6, "tie_word_embeddings": True,
            "max_position_embeddings": 128} if module is qwen3 else {}),
    )  # fmt: skip
    mx.random.seed(5)
    model = module.Model(args)
    for i, layer in enumerate(model.model.layers):  # norms that differ (mlx-lm's start at 1)
        for j, norm in enumerate((layer.input_layernorm, layer.post_attention_layernorm)):
            norm.weight = 1 + 0.5 * mx.random.normal((64,), key=mx.random.key(10 * i + j))
    mx.eval(model.parameters())
    fuse_projections(model)
    return model


def forwards(model: Any) -> list[mx.array]:
    """A 12-token prompt's logits, then three decode steps' on its cache."""
    cache = make_prompt_cache(model)
    tokens = mx.array([[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 50]])
    outputs = [model(tokens, cache=cache)]
    for _ in range(3):
        tokens = mx.argmax(outputs[-1][:, -1:], axis=-1)
        outputs.append(model(tokens, cache=cache))
    mx.eval(outputs)
    return outputs


@pytest.mark.parametrize("module", [llama, qwen2, qwen3])
def test_a_served_model_gives_mlx_lms_outputs_with_the_adds_fused_across_blocks(
    module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_of(module)
    want = forwards(model)
    calls: list[int] = []
    fused = _fused_norm.add_rms_norm

    def counted(x: mx.array, r: mx.array, norm: Any) -> tuple[mx.array, mx.array]:
        calls.append(x.shape[1])
        return fused(x, r, norm)

    monkeypatch.setattr(_fused_norm, "add_rms_norm", counted)
    monkeypatch.setattr(_fused_norm, "ENABLED", True)
    assert install(model, anywhere=True) == LAYERS
    assert install(model, anywhere=True) == LAYERS  # idempotent
    assert [layer._nursery_last for layer in model.model.layers] == [False, False, True]
    got = forwards(model)
    # each block's post-attention norm, and every block's input norm but the first's
    assert calls == [12] * (2 * LAYERS - 1) + [1] * (2 * LAYERS - 1) * 3
    for g, w in zip(got, want, strict=True):
        assert mx.array_equal(g, w)
    assert _fused_norm._thread.pending is None  # the last block leaves nothing pending


def test_a_block_called_on_anything_but_the_pending_sum_norms_its_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loop that changes the hidden state between blocks (or another model's forward in
    between) finds no pending sum for its input: the block norms what it is given."""
    model = model_of(llama)
    monkeypatch.setattr(_fused_norm, "ENABLED", True)
    install(model, anywhere=True)
    first, second = model.model.layers[:2]
    x = mx.random.normal((1, 4, 64), key=mx.random.key(1))
    out = first(x)
    assert _fused_norm._thread.pending is not None and _fused_norm._thread.pending.total is out
    changed = out * 2
    got = second(changed)
    reference = type(second).__mro__[1].__call__(second, changed)
    assert mx.array_equal(got, reference)


def test_only_mlx_lms_own_llama_shaped_blocks_are_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fused_norm, "ENABLED", True)
    gemma_model = gemma.Model(
        gemma.ModelArgs(
            model_type="gemma",
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rms_norm_eps=1e-6,
            vocab_size=96,
        )
    )
    assert install(gemma_model, anywhere=True) == 0  # its norms scale by 1 + w
    model = model_of(llama)

    class Own(type(model.model.layers[0])):  # type: ignore[misc]
        pass

    model.model.layers[-1].__class__ = Own
    assert install(model, anywhere=True) == LAYERS - 1
    # the block before one that takes no pending sum leaves none
    assert [getattr(b, "_nursery_last", None) for b in model.model.layers] == [False, True, None]
    if not on_cuda():
        assert install(model_of(llama)) == 0  # the kernel is CUDA's
    monkeypatch.setattr(_fused_norm, "ENABLED", False)
    assert install(model_of(llama), anywhere=True) == 0  # off unless enabled


def test_off_cuda_the_kernel_is_refused_and_mlxs_operations_serve() -> None:
    if on_cuda():
        pytest.skip("CUDA runs the kernel")
    assert not usable(mx.float32, 64)
    x, r = mx.ones((2, 3, 64)), mx.full((2, 3, 64), 2.0)
    norm = nn.RMSNorm(64)
    h, out = add_rms_norm(x, r, norm)
    assert mx.array_equal(h, x + r) and mx.array_equal(out, norm(x + r))


def test_the_kernel_gives_mlxs_add_and_rms_norm() -> None:
    """In each dtype, for a decode step's rows, a prefill chunk's, and rows that leave a
    block of warps part empty."""
    if not on_cuda():
        pytest.skip("the kernel is CUDA's")
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        for rows, width in ((1, 4096), (7, 64), (33, 1024), (300, 2048)):
            keys = mx.random.split(mx.random.key(rows * width), 3)
            x, r, w = (mx.random.normal((rows, width), key=k).astype(dtype) for k in keys)
            norm = nn.RMSNorm(width, eps=1e-6)
            norm.weight = w
            assert usable(dtype, width)
            h, out = add_rms_norm(x[None], r[None], norm)
            assert mx.array_equal(h[0], x + r), (dtype, rows, width)
            want = mx.fast.rms_norm(x + r, w, 1e-6).astype(mx.float32)
            tolerance = 1e-5 if dtype == mx.float32 else 2e-2
            got = out[0].astype(mx.float32)
            assert mx.allclose(got, want, atol=tolerance, rtol=tolerance), (dtype, rows, width)
