"""The GGUF converter on files written here: llama.cpp names, permuted Q/K rows, F32 and F16.

A tiny random llama is written as llama.cpp would write it (tensor names, Q/K rows permuted
for its RoPE layout, tokenizer in the metadata), converted back, and must compute the same
logits and tokenize the same way. The Q4_1/Q8_0 path is covered end to end by the default
model test.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import llama
from mlx_lm.utils import load

from mlx_nursery.tools import GGUFConversionError, convert_gguf

HEADS, KV_HEADS, HIDDEN = 4, 2, 64
_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _permute(w: mx.array, heads: int) -> mx.array:
    """llama.cpp's convert_hf_to_gguf permute of Q/K rows."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _write_gguf(path: Path, tiny_model: Path, dtype: mx.Dtype) -> llama.Model:
    tokenizer = json.loads((tiny_model / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in tokenizer["model"]["merges"]]
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rms_norm_eps=1e-5,
        vocab_size=len(tokens),
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    mx.random.seed(3)
    model = llama.Model(args)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        value = value.astype(dtype)
        if name == "model.embed_tokens.weight":
            weights["token_embd.weight"] = value
        elif name == "model.norm.weight":
            weights["output_norm.weight"] = value
        elif name == "lm_head.weight":
            weights["output.weight"] = value
        else:
            _, _, layer, *rest = name.split(".")
            module, part = ".".join(rest[:-1]), rest[-1]
            if module == "self_attn.q_proj":
                value = _permute(value, HEADS)
            elif module == "self_attn.k_proj":
                value = _permute(value, KV_HEADS)
            weights[f"blk.{layer}.{_NAMES[module]}.{part}"] = value
    specials = {t["content"] for t in tokenizer["added_tokens"]}
    metadata = {
        "general.architecture": "llama",
        "llama.embedding_length": mx.array(HIDDEN, dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(128, dtype=mx.uint32),
        "llama.block_count": mx.array(2, dtype=mx.uint32),
        "llama.attention.head_count": mx.array(HEADS, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(KV_HEADS, dtype=mx.uint32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "llama.context_length": mx.array(2048, dtype=mx.uint32),
        "llama.vocab_size": mx.array(len(tokens), dtype=mx.uint32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array(
            [3 if t in specials else 1 for t in tokens], dtype=mx.int32
        ),
        "tokenizer.ggml.eos_token_id": mx.array(vocab["<|im_end|>"], dtype=mx.uint32),
    }
    mx.save_gguf(str(path), weights, metadata)
    return model


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=["F32", "F16"])
def test_converted_model_matches_the_original(
    tiny_model: Path, tmp_path: Path, dtype: mx.Dtype
) -> None:
    source = tmp_path / "tiny.gguf"
    original = _write_gguf(source, tiny_model, dtype)
    out = convert_gguf(source, tmp_path / "converted", scales_dtype="float32")
    converted, tokenizer = load(str(out))
    prompt = mx.array([[5, 17, 99, 3, 250, 42]])
    # The original's weights as written (rounded to `dtype`), computed in float32 as converted.
    original.update(tree_map(lambda p: p.astype(dtype).astype(mx.float32), original.parameters()))
    expected = original(prompt)
    got = converted(prompt)
    assert mx.allclose(got.astype(mx.float32), expected, atol=1e-3).item()
    reference = json.loads((tiny_model / "tokenizer.json").read_text())
    text = "Hello <|im_start|>user 12345 tokens!"
    from tokenizers import Tokenizer

    assert (
        tokenizer.encode(text, add_special_tokens=False)
        == Tokenizer.from_str(json.dumps(reference)).encode(text, add_special_tokens=False).ids
    )
    config = json.loads((out / "config.json").read_text())
    assert config["num_key_value_heads"] == KV_HEADS and "quantization" not in config


def test_unsupported_architectures_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    mx.save_gguf(str(path), {"w": mx.zeros((2,))}, {"general.architecture": "mamba"})
    with pytest.raises(GGUFConversionError, match="mamba"):
        convert_gguf(path, tmp_path / "out")
