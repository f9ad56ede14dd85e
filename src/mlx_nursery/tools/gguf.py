"""Convert a llama-family GGUF file into an mlx-lm model directory, offline.

`mx.load` reads GGUF natively and hands back Q4_0 / Q4_1 / Q8_0 tensors as MLX
affine-quantized triples (weight, scales, biases), so no dequantization round
trip is needed. What remains is llama.cpp's conventions:

- tensor names (`blk.N.attn_q.weight`) become mlx-lm's (`model.layers.N.self_attn.q_proj.weight`);
- llama.cpp permutes the rows of the Q and K projections for its RoPE layout;
  mlx-lm uses the Hugging Face layout, so the permutation is undone. It acts on
  whole output rows, so it applies to packed 4-bit rows and their scales alike;
- the tokenizer lives in the metadata (tokens, merges, token types) and is
  rebuilt as a `tokenizers` byte-level BPE;
- quantization scales default to float32 on the CPU backend, where float16
  scales make quantized matmuls many times slower (docs/benchmarks.md, "Findings
  behind the current design").
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama",)
GGML_BLOCK = 32

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_TENSOR = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|scales|biases)$")
# Pre-tokenizers llama.cpp names in `tokenizer.ggml.pre` that split digits one by one.
_DIGIT_SPLITTING_PRE = {"smollm", "smaug-bpe", "llama-bpe", "llama3"}


class GGUFConversionError(ValueError):
    """The file is not a GGUF this converter supports; the message says what is missing."""


def convert_gguf(
    source: str | Path,
    out: str | Path,
    *,
    scales_dtype: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> Path:
    """Write an mlx-lm model directory for `source` at `out` (written aside, then renamed).

    `scales_dtype`: "float32" or "float16"; None picks float32 on the CPU backend.
    """
    import mlx.core as mx

    source, out = Path(source), Path(out)
    if not source.is_file():
        raise GGUFConversionError(f"{source} is not a file")
    progress(f"reading {source.name}")
    try:
        loaded: Any = mx.load(str(source), return_metadata=True)
        tensors: dict[str, mx.array] = loaded[0]
        metadata: dict[str, Any] = loaded[1]
    except Exception as exc:  # mx.load's message names the unsupported tensor type
        raise GGUFConversionError(f"cannot read {source} as GGUF: {exc}") from exc
    meta = {key: _plain(value) for key, value in metadata.items()}
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFConversionError(
            f"architecture {arch!r} is not supported"
            f" (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if (
        meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", "linear")
        or "rope_freqs.weight" in tensors
    ):
        raise GGUFConversionError("GGUF files with llama3-style RoPE scaling are not supported yet")
    if scales_dtype is None:
        scales_dtype = "float32" if mx.default_device() == mx.cpu else "float16"

    config = _model_config(meta, arch, tensors)
    weights, quantization = _convert_tensors(tensors, config, getattr(mx, scales_dtype))
    if quantization:
        config["quantization"] = quantization

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    progress(f"writing {len(weights)} tensors")
    mx.save_safetensors(str(staging / "model.safetensors"), weights, metadata={"format": "mlx"})
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    progress("rebuilding the tokenizer")
    _write_tokenizer(staging, meta, config["max_position_embeddings"])
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def _plain(value: Any) -> Any:
    """GGUF metadata comes as mx.arrays for numbers; make it plain Python."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _model_config(meta: dict[str, Any], arch: str, tensors: dict[str, Any]) -> dict[str, Any]:
    def need(key: str) -> Any:
        if f"{arch}.{key}" not in meta:
            raise GGUFConversionError(f"metadata {arch}.{key} is missing")
        return meta[f"{arch}.{key}"]

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(meta.get(f"{arch}.rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 4096)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }


def _convert_tensors(
    tensors: dict[str, Any], config: dict[str, Any], scales_dtype: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    import mlx.core as mx

    weights: dict[str, Any] = {}
    quantized: dict[str, dict[str, int]] = {}
    for name, array in tensors.items():
        match = _TENSOR.match(name)
        if match is None:
            raise GGUFConversionError(f"unexpected tensor {name!r}")
        layer, kind, part = match.groups()
        if layer is None:
            if kind not in _GLOBAL_NAMES:
                raise GGUFConversionError(f"unexpected tensor {name!r}")
            prefix = _GLOBAL_NAMES[kind]
        else:
            if kind not in _LAYER_NAMES:
                raise GGUFConversionError(f"unexpected tensor {name!r}")
            prefix = f"model.layers.{layer}.{_LAYER_NAMES[kind]}"
        if kind == "attn_q":
            array = _unpermute_rows(array, config["num_attention_heads"])
        elif kind == "attn_k":
            array = _unpermute_rows(array, config["num_key_value_heads"])
        if part in ("scales", "biases") or array.dtype == mx.float16 or array.dtype == mx.bfloat16:
            array = array.astype(scales_dtype)
        weights[f"{prefix}.{part}"] = array
        if part == "scales":
            # GGML blocks hold 32 weights: in_features = groups * 32; bits follow from the packing.
            packed = tensors[name.replace(".scales", ".weight")]
            in_features = array.shape[-1] * GGML_BLOCK
            quantized[prefix] = {
                "bits": packed.shape[-1] * 32 // in_features,
                "group_size": GGML_BLOCK,
            }
    if not quantized:
        return weights, {}
    # The most common setting is the default; every layer is also listed explicitly.
    bits = [q["bits"] for q in quantized.values()]
    return weights, {"bits": max(set(bits), key=bits.count), "group_size": GGML_BLOCK, **quantized}


def _unpermute_rows(array: Any, heads: int) -> Any:
    """Undo llama.cpp's `permute` of Q/K rows: it stored (heads, 2, d/2) as (heads, d/2, 2)."""
    rows = array.shape[0]
    rest = array.shape[1:]
    return array.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def _write_tokenizer(out: Path, meta: dict[str, Any], context_length: int) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise GGUFConversionError(
            f"tokenizer {meta.get('tokenizer.ggml.model')!r} is not supported (byte-level BPE only)"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types: list[int] = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") in _DIGIT_SPLITTING_PRE:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    # Type 3 = control, 4 = user-defined: matched whole, never split by BPE.
    specials = [
        AddedToken(t, special=True, normalized=False)
        for t, k in zip(tokens, types, strict=True)
        if k in (3, 4)
    ]
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(out / "tokenizer.json"))

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), "utf-8")
