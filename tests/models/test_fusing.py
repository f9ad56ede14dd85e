"""Fused projections (models/_fusing.py): the fused model computes what the checkpoint's
layout computes, on mlx-lm's own architectures, plain and quantized, through a KV cache."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache
from mlx_lm.utils import _get_classes

from mlx_nursery.models import load_model
from mlx_nursery.models._fusing import FusedPart, fuse_projections

_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
}

ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {"attention_bias": True, "mlp_bias": True},
    "mistral": {"tie_word_embeddings": False},
    "qwen2": {},
    "qwen3": {"tie_word_embeddings": True},
    "gemma": {},
    "gemma2": {"query_pre_attn_scalar": 16.0},
    "gemma3_text": {"sliding_window": 4, "sliding_window_pattern": 2},
    "ministral3": {
        "rope_parameters": {
            "rope_theta": 10000.0,
            "rope_type": "default",
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 256,
        }
    },
}
"""mlx-lm's architectures that are fused, each at a tiny shape (with the options that give
its projections biases where it has them)."""


def build(model_type: str, **overrides: Any) -> nn.Module:
    config = {"model_type": model_type, **_SHAPE, **ARCHITECTURES.get(model_type, {}), **overrides}
    model_class, args_class = _get_classes(config)
    mx.random.seed(3)
    model: nn.Module = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model


def twin(model: nn.Module) -> nn.Module:
    """A second model of the same class on the same arrays (fusing it leaves `model`'s)."""
    other: nn.Module = type(model)(model.args)
    if isinstance(model.layers[0].self_attn.q_proj, nn.QuantizedLinear):
        nn.quantize(other, group_size=32, bits=4)
    other.update(tree_unflatten(tree_flatten(model.parameters())))
    return other


def nbytes(model: nn.Module) -> int:
    return sum(a.nbytes for _, a in tree_flatten(model.parameters()))


def logits_through_a_cache(model: nn.Module, quantized_kv: bool = False) -> list[mx.array]:
    """A batch of two prompts prefilled, then three decode steps, through mlx-lm's caches."""
    if quantized_kv:
        cache: list[Any] = [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]
    else:
        cache = make_prompt_cache(model)
    prompt = mx.array([[3, 14, 15, 92, 65, 35, 89], [2, 71, 82, 81, 82, 84, 59]])
    out = [model(prompt, cache=cache)]
    for step in range(3):
        out.append(model(mx.array([[7 + step], [40 + step]]), cache=cache))
    mx.eval(out)
    return out


@pytest.mark.parametrize("quantized", [False, True], ids=["plain", "quantized"])
@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_fused_model_computes_the_same_logits(model_type: str, quantized: bool) -> None:
    model = build(model_type)
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
    fused = twin(model)
    before = nbytes(fused)

    fusion = fuse_projections(fused)

    layers = len(model.layers)
    assert (fusion.attention, fusion.mlp) == (layers, layers)
    names = [name for name, _ in tree_flatten(fused.parameters())]
    assert sum(".qkv_proj.weight" in n for n in names) == layers
    assert sum(".gate_up_proj.weight" in n for n in names) == layers
    assert not any(part in n for n in names for part in ("q_proj", "k_proj", "gate_proj"))
    # Each weight counted once: the fused arrays replace their parts, the parts hold none.
    assert nbytes(fused) == before
    attention = fused.layers[0].self_attn
    assert isinstance(attention.q_proj, FusedPart) and isinstance(attention.v_proj, FusedPart)
    if model_type in ("llama", "qwen2"):
        assert "bias" in attention.qkv_proj
    if quantized:
        assert isinstance(attention.qkv_proj, nn.QuantizedLinear)
    for expected, got in zip(
        logits_through_a_cache(model), logits_through_a_cache(fused), strict=True
    ):
        assert mx.allclose(expected, got, rtol=1e-5, atol=1e-5).item()


def test_fused_model_with_quantized_kv_cache_computes_the_same_logits() -> None:
    model = build("qwen3", head_dim=32)
    fused = twin(model)
    fuse_projections(fused)
    expected, got = logits_through_a_cache(model, True), logits_through_a_cache(fused, True)
    for a, b in zip(expected, got, strict=True):
        assert mx.allclose(a, b, rtol=1e-5, atol=1e-5).item()


def test_parts_called_on_other_inputs_or_out_of_order_still_compute_their_rows() -> None:
    model = build("qwen3")
    fused = twin(model)
    fuse_projections(fused)
    plain, parts = model.layers[0].self_attn, fused.layers[0].self_attn
    x, y = mx.random.normal((1, 3, 64)), mx.random.normal((1, 3, 64))
    calls = [("v_proj", x), ("q_proj", y), ("q_proj", x), ("k_proj", x), ("k_proj", x)]
    for name, value in calls:
        assert mx.allclose(parts[name](value), plain[name](value), atol=1e-5).item()


def test_uncovered_architectures_and_mismatched_groups_stay_as_they_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """phi3 has one qkv_proj already: nothing to fuse, said at debug level. A group whose
    parts are quantized differently stays apart; the other groups are fused."""
    phi3 = build("phi3")
    before = [name for name, _ in tree_flatten(phi3.parameters())]
    with caplog.at_level(logging.DEBUG, logger="mlx_nursery.models"):
        fusion = fuse_projections(phi3)
    assert not fusion.fused
    assert [name for name, _ in tree_flatten(phi3.parameters())] == before
    assert any(r.levelno == logging.DEBUG and "not fused" in r.message for r in caplog.records)

    def eight_bit_values(path: str, module: nn.Module) -> bool | dict[str, int]:
        if "v_proj" in path:
            return {"group_size": 32, "bits": 8}
        return hasattr(module, "to_quantized")

    model = build("llama")
    nn.quantize(model, group_size=32, bits=4, class_predicate=eight_bit_values)
    fusion = fuse_projections(model)
    assert (fusion.attention, fusion.mlp) == (0, 2)
    assert model.layers[0].self_attn.v_proj.bits == 8


def test_loading_fuses_unless_told_not_to_and_keeps_the_logits(tiny_model: Path) -> None:
    fused = load_model(tiny_model).model
    plain = load_model(tiny_model, fuse_weights=False).model
    assert fused is not None and plain is not None
    assert isinstance(fused.layers[0].mlp.up_proj, FusedPart)
    assert isinstance(plain.layers[0].mlp.up_proj, nn.Linear)
    assert nbytes(fused) == nbytes(plain)
    for a, b in zip(logits_through_a_cache(plain), logits_through_a_cache(fused), strict=True):
        assert mx.allclose(a, b, rtol=1e-5, atol=1e-5).item()


def test_a_vision_models_two_language_models_share_the_fused_arrays(tiny_vlm: Path) -> None:
    """mlx-vlm's language model (image prefills) gets the same fused arrays as mlx-lm's text
    model (decoding): the old ones are freed from both, and MLX holds no more than the
    unfused model did."""
    mx.clear_cache()
    start = mx.get_active_memory()
    plain = load_model(tiny_vlm, fuse_weights=False)
    unfused_bytes = mx.get_active_memory() - start
    loaded = load_model(tiny_vlm)
    assert mx.get_active_memory() - start == 2 * unfused_bytes
    assert loaded.model is not None and loaded.vision is not None
    text = dict(tree_flatten(loaded.model.language_model.parameters()))
    vision = dict(tree_flatten(loaded.vision.model.language_model.parameters()))
    assert text.keys() == vision.keys()
    assert all(text[k] is vision[k] for k in text)
    assert "model.layers.1.self_attn.qkv_proj.bias" in text
    prompt = mx.array([[5, 6, 7, 8, 9]])
    assert plain.model is not None and plain.vision is not None
    assert mx.allclose(plain.model(prompt), loaded.model(prompt), atol=1e-5).item()
    old, new = plain.vision.model.language_model, loaded.vision.model.language_model
    assert mx.allclose(old(prompt).logits, new(prompt).logits, atol=1e-5).item()
