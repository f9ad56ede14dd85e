"""The CTranslate2 Whisper converter, offline: the tiny random Whisper written in CTranslate2's
format (its fused projections, PyTorch's conv layout, a tokenizer without timestamps), then
converted back, transcribes exactly as the original."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from mlx_nursery.engine import TranscriptionRequest
from mlx_nursery.models import load_speech_model
from mlx_nursery.tools import convert_ct2_whisper
from tests.speech_helpers import clip

_TYPE_IDS = {np.dtype(np.float32): 0, np.dtype(np.int16): 2, np.dtype(np.float16): 4}


def write_ct2(path: Path, variables: dict[str, np.ndarray], aliases: dict[str, str]) -> None:
    """CTranslate2's model.bin, binary version 6 (what faster-whisper's converter writes)."""

    def string(text: str) -> bytes:
        raw = text.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = [struct.pack("<I", 6), string("WhisperSpec"), struct.pack("<I", 3)]
    out.append(struct.pack("<I", len(variables)))
    for name, value in sorted(variables.items()):
        data = np.ascontiguousarray(value).tobytes()
        out += [string(name), bytes([value.ndim]), struct.pack(f"<{value.ndim}I", *value.shape)]
        out += [bytes([_TYPE_IDS[value.dtype]]), struct.pack("<I", len(data)), data]
    out.append(struct.pack("<I", len(aliases)))
    out += [string(alias) + string(target) for alias, target in aliases.items()]
    path.write_bytes(b"".join(out))


def as_ct2(model: Path, out: Path) -> None:
    w = load_file(str(model / "model.safetensors"))
    config = json.loads((model / "config.json").read_text())
    v: dict[str, np.ndarray] = {}

    def linear(src: str, dst: str) -> None:
        v[f"{dst}/weight"], v[f"{dst}/bias"] = w[f"{src}.weight"], w[f"{src}.bias"]

    def norm(src: str, dst: str) -> None:
        v[f"{dst}/gamma"], v[f"{dst}/beta"] = w[f"{src}.weight"], w[f"{src}.bias"]

    def fused(src: str, dst: str, parts: tuple[str, ...]) -> None:
        v[f"{dst}/weight"] = np.concatenate([w[f"{src}.{p}.weight"] for p in parts])
        v[f"{dst}/bias"] = np.concatenate(
            [w.get(f"{src}.{p}.bias", np.zeros_like(w[f"{src}.query.bias"])) for p in parts]
        )

    for conv in ("conv1", "conv2"):
        v[f"encoder/{conv}/weight"] = w[f"encoder.{conv}.weight"].transpose(0, 2, 1)
        v[f"encoder/{conv}/bias"] = w[f"encoder.{conv}.bias"]
    for side in ("encoder", "decoder"):
        for i in range(config[f"{side}_layers"]):
            src, dst = f"{side}.blocks.{i}", f"{side}/layer_{i}"
            norm(f"{src}.attn_ln", f"{dst}/self_attention/layer_norm")
            fused(f"{src}.attn", f"{dst}/self_attention/linear_0", ("query", "key", "value"))
            linear(f"{src}.attn.out", f"{dst}/self_attention/linear_1")
            if side == "decoder":
                norm(f"{src}.cross_attn_ln", f"{dst}/attention/layer_norm")
                linear(f"{src}.cross_attn.query", f"{dst}/attention/linear_0")
                fused(f"{src}.cross_attn", f"{dst}/attention/linear_1", ("key", "value"))
                linear(f"{src}.cross_attn.out", f"{dst}/attention/linear_2")
            norm(f"{src}.mlp_ln", f"{dst}/ffn/layer_norm")
            linear(f"{src}.mlp1", f"{dst}/ffn/linear_0")
            linear(f"{src}.mlp2", f"{dst}/ffn/linear_1")
        v[f"{side}/num_heads"] = np.array(config[f"{side}_attention_heads"], dtype=np.int16)
    norm("encoder.ln_post", "encoder/layer_norm")
    norm("decoder.ln", "decoder/layer_norm")
    v["encoder/position_encodings/encodings"] = np.zeros((1500, config["d_model"]), np.float32)
    v["decoder/embeddings/weight"] = w["decoder.token_embedding.weight"]
    v["decoder/position_encodings/encodings"] = w["decoder.positional_embedding"]
    out.mkdir()
    write_ct2(out / "model.bin", v, {"decoder/projection/weight": "decoder/embeddings/weight"})
    generation = json.loads((model / "generation_config.json").read_text())
    (out / "config.json").write_text(json.dumps(generation))
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [
        t for t in tokenizer["added_tokens"] if not t["content"][2:3].isdigit()
    ]  # faster-whisper's tokenizer.json has no timestamp tokens
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))


def test_a_ct2_whisper_converts_back_to_the_same_model(tiny_whisper: Path, tmp_path: Path) -> None:
    from mlx_nursery.engine import _whisper

    as_ct2(tiny_whisper, tmp_path / "ct2")
    converted = convert_ct2_whisper(tmp_path / "ct2", tmp_path / "mlx")
    request = TranscriptionRequest(clip(2), temperatures=(0.0,))
    results = []
    for path in (tiny_whisper, converted):
        loaded = load_speech_model(path)  # strict: every weight present
        assert loaded.word_timestamps
        results.append(_whisper.transcribe(loaded.model, request, lambda: None, lambda w: None))
    original, roundtrip = results
    assert roundtrip.text == original.text
    assert repr(roundtrip.segments) == repr(original.segments)  # repr: NaN statistics alike
