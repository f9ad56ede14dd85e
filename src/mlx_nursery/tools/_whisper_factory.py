"""A Whisper directory that mlx-audio loads (`mlx_audio.stt.load(path, strict=True)`),
random weights, offline.

The weights come from mlx-audio's own Whisper class, so names and shapes are the ones its
loader checks. The tokenizer is a byte-level BPE trained on the text factory's corpus with
Whisper's special tokens after it and the 1501 timestamp tokens `<|0.00|>`..`<|30.00|>` as
the top ids, where Whisper's decoding rules expect them (every id at or above `<|0.00|>` is
a timestamp). transformers' WhisperProcessor reads it with the feature extractor's config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ._presets import Preset
from ._tokenizer_factory import corpus

EOT = "<|endoftext|>"
SPECIAL_TOKENS = [
    EOT,
    "<|startoftranscript|>",
    "<|en|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
]
TIMESTAMP_TOKENS = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]

_FEATURE_EXTRACTOR = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "processor_class": "WhisperProcessor",
    "feature_size": 80,
    "sampling_rate": 16000,
    "hop_length": 160,
    "chunk_length": 30,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": False,
}


def write_whisper(out: Path, spec: Preset, dtype: str, seed: int) -> None:
    """Write `spec`'s Whisper into `out`: config, weights, tokenizer, feature extractor,
    generation config (alignment heads, for word timestamps). Uses MLX's global random
    state, seeded here."""
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    eot, sot = _write_tokenizer(out, spec)
    config: dict[str, Any] = dict(spec.config)
    config.update(
        eos_token_id=eot,
        bos_token_id=eot,
        pad_token_id=eot,
        decoder_start_token_id=sot,
        torch_dtype=dtype,
        mlx_nursery_preset=spec.name,
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    (out / "preprocessor_config.json").write_text(
        json.dumps(_FEATURE_EXTRACTOR, indent=2, sort_keys=True), "utf-8"
    )
    layers, heads = int(config["decoder_layers"]), int(config["decoder_attention_heads"])
    alignment = [[layer, head] for layer in range(layers // 2, layers) for head in range(heads)]
    (out / "generation_config.json").write_text(
        json.dumps({"alignment_heads": alignment}, indent=2), "utf-8"
    )
    mx.random.seed(seed)
    model = Model(ModelDimensions.from_dict(config), getattr(mx, dtype))
    model.set_dtype(getattr(mx, dtype))
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = dict(sorted(flat, key=lambda kv: kv[0]))
    mx.eval(list(weights.values()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def _write_tokenizer(out: Path, spec: Preset) -> tuple[int, int]:
    """tokenizer.json and tokenizer_config.json; the ids of end-of-text and start."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.trained_vocab,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.add_special_tokens(SPECIAL_TOKENS + TIMESTAMP_TOKENS)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        raise ValueError(
            f"{spec.name}: the tokenizer has {tokenizer.get_vocab_size()} ids, "
            f"the model {spec.vocab_size}"
        )
    (out / "tokenizer.json").write_text(tokenizer.to_str(), "utf-8")
    config = {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "pad_token": EOT,
        "model_max_length": int(spec.config["max_target_positions"]),
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True), "utf-8"
    )
    eot, sot = tokenizer.token_to_id(EOT), tokenizer.token_to_id("<|startoftranscript|>")
    assert eot is not None and sot is not None
    return eot, sot
