"""Write complete, loadable model directories offline (random weights).

Tests and benchmarks need real models without a model hub: this writes the
preset's real architecture config, random weights drawn from a seeded MLX
generator, and a tokenizer trained locally. Same preset, dtype and seed give
the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

from ._chat_template import CHAT_TEMPLATE, thinking_template
from ._presets import PRESETS, Preset
from ._tokenizer_factory import EOS_TOKEN, PAD_TOKEN, THINK_TOKENS, write_tokenizer

DType = Literal["float32", "bfloat16", "float16"]
_SHARD_BYTES = 4 << 30
QUANT_GROUP = 64
"""The quantization group of `bits` models (mlx-lm's default)."""

__all__ = ["PRESETS", "make_model"]


def make_model(
    out: str | Path,
    preset: str = "tiny",
    *,
    dtype: DType = "float32",
    seed: int = 0,
    bits: int | None = None,
) -> Path:
    """Write a model directory for `preset` into `out` and return its path; `bits` (4 or 8,
    text models): its weights quantized as mlx-lm quantizes them (affine, groups of
    `QUANT_GROUP`), drawn and written a shard at a time, so a model larger than the
    device's memory can be written.

    Must run on the thread that will not race other MLX work (it uses the global
    MLX random state, seeded here).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    text = not (
        spec.speech
        or spec.synthesis
        or spec.image_processor is not None
        or spec.reranker
        or spec.embedding is not None
    )
    if bits is not None and (bits not in (4, 8) or not text):
        raise ValueError("bits must be 4 or 8, for a text model's preset")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if spec.speech:
        from ._whisper_factory import write_whisper

        write_whisper(out, spec, dtype, seed)
        return out
    if spec.synthesis:
        from ._tts_factory import write_tts

        write_tts(out, spec, dtype, seed)
        return out
    if spec.image_processor is not None:
        from ._vlm_factory import write_vlm

        write_vlm(out, spec, dtype, seed)
        return out
    if spec.reranker:
        from ._reranker_factory import write_reranker_model

        write_reranker_model(out, spec, dtype, seed)
        return out
    if spec.embedding is not None:
        from ._embedding_factory import write_embedding_model

        write_embedding_model(out, spec, dtype, seed)
        return out
    context_length = int(spec.config["max_position_embeddings"])
    thinking = spec.thinking is not None
    token_ids = write_tokenizer(
        out,
        spec.trained_vocab,
        spec.vocab_size,
        context_length,
        added_tokens=THINK_TOKENS if thinking else None,
        chat_template=thinking_template(spec.thinking == "prompt") if thinking else CHAT_TEMPLATE,
    )
    config = _model_config(spec, token_ids, dtype)
    if bits is not None:
        config["quantization"] = {"group_size": QUANT_GROUP, "bits": bits}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    _write_weights(out, config, getattr(mx, dtype), seed, bits)
    return out


def _model_config(spec: Preset, token_ids: dict[str, int], dtype: str) -> dict[str, Any]:
    config = dict(spec.config)
    config["eos_token_id"] = [token_ids[EOS_TOKEN], token_ids[PAD_TOKEN]]
    config["pad_token_id"] = token_ids[PAD_TOKEN]
    config["torch_dtype"] = dtype
    config["mlx_nursery_preset"] = spec.name
    return config


def _write_weights(
    out: Path, config: dict[str, Any], dtype: mx.Dtype, seed: int, bits: int | None
) -> None:
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model: Any = model_class(args_class.from_dict(config))
    model.set_dtype(dtype)
    if bits is not None:  # still lazy: each weight is drawn and quantized when its shard is
        nn.quantize(model, group_size=QUANT_GROUP, bits=bits)  # type: ignore[attr-defined]
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    del model
    shards = _shard(sorted(flat, key=lambda kv: kv[0]))
    del flat  # the shards hold the only references: each is freed once written
    weight_map: dict[str, str] = {}
    total = 0
    for index in range(1, len(shards) + 1):
        shard, shards[index - 1] = shards[index - 1], []
        name = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        )
        arrays = dict(shard)
        mx.eval(list(arrays.values()))  # one shard at a time bounds peak memory
        mx.save_safetensors(str(out / name), arrays, metadata={"format": "mlx"})
        total += sum(a.nbytes for a in arrays.values())
        weight_map.update({key: name for key in arrays})
        del arrays
    if len(shards) > 1:
        index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(
            json.dumps(index_doc, indent=2, sort_keys=True)
        )


def _shard(weights: list[tuple[str, mx.array]]) -> list[list[tuple[str, mx.array]]]:
    shards: list[list[tuple[str, mx.array]]] = [[]]
    size = 0
    for key, value in weights:
        if shards[-1] and size + value.nbytes > _SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((key, value))
        size += value.nbytes
    return shards
