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
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

from ._chat_template import CHAT_TEMPLATE, thinking_template
from ._presets import PRESETS, Preset
from ._tokenizer_factory import EOS_TOKEN, PAD_TOKEN, THINK_TOKENS, write_tokenizer

DType = Literal["float32", "bfloat16", "float16"]
_SHARD_BYTES = 4 << 30

__all__ = ["PRESETS", "make_model"]


def make_model(
    out: str | Path, preset: str = "tiny", *, dtype: DType = "float32", seed: int = 0
) -> Path:
    """Write a model directory for `preset` into `out` and return its path.

    Must run on the thread that will not race other MLX work (it uses the global
    MLX random state, seeded here).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    spec = PRESETS[preset]
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
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    _write_weights(out, config, getattr(mx, dtype), seed)
    return out


def _model_config(spec: Preset, token_ids: dict[str, int], dtype: str) -> dict[str, Any]:
    config = dict(spec.config)
    config["eos_token_id"] = [token_ids[EOS_TOKEN], token_ids[PAD_TOKEN]]
    config["pad_token_id"] = token_ids[PAD_TOKEN]
    config["torch_dtype"] = dtype
    config["mlx_nursery_preset"] = spec.name
    return config


def _write_weights(out: Path, config: dict[str, Any], dtype: mx.Dtype, seed: int) -> None:
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model: Any = model_class(args_class.from_dict(config))
    model.set_dtype(dtype)
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = sorted(flat, key=lambda kv: kv[0])
    shards = _shard(weights)
    weight_map: dict[str, str] = {}
    total = 0
    for index, shard in enumerate(shards, start=1):
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
