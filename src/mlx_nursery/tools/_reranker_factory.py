"""Write loadable cross-encoder (reranker) directories offline (random weights).

The layout is a Hugging Face sequence-classification checkpoint's, as rerankers come:
`config.json` naming `BertForSequenceClassification` or `XLMRobertaForSequenceClassification`
with one label, the weights under the checkpoint's names (the encoder's under `bert.` or
`roberta.`, the head's under `classifier.`), and a tokenizer that frames a pair as the
family does (BERT: `[CLS] q [SEP] d [SEP]`, the document's tokens of type 1; RoBERTa:
`<s> q </s></s> d </s>`).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from ._embedding_factory import BERT, ROBERTA, write_encoder_tokenizer

_FAMILIES = {"bert": ("bert", "bert", BERT), "xlm-roberta": ("xlm_roberta", "roberta", ROBERTA)}
"""model_type -> mlx-embeddings' module, the checkpoint's encoder prefix, the tokenizer."""


def write_reranker_model(out: Path, preset: Any, dtype: str, seed: int) -> None:
    """Write `preset` (a reranker `Preset`) into `out`: config, weights, tokenizer."""
    module_name, prefix, family = _FAMILIES[str(preset.config["model_type"])]
    context_length = int(preset.config["max_position_embeddings"])
    if family is ROBERTA:
        context_length -= 2  # RoBERTa's positions start after the padding id
    ids = write_encoder_tokenizer(
        out, preset.trained_vocab, preset.vocab_size, context_length, family
    )
    config = dict(preset.config)
    config.update(
        pad_token_id=ids[family.roles["pad_token"]],
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
        torch_dtype=dtype,
        mlx_nursery_preset=preset.name,
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    _write_weights(out, config, module_name, prefix, getattr(mx, dtype), seed)


def _write_weights(
    out: Path, config: dict[str, Any], module_name: str, prefix: str, dtype: mx.Dtype, seed: int
) -> None:
    try:
        module = importlib.import_module(f"mlx_embeddings.models.{module_name}")
    except ImportError:
        raise ModuleNotFoundError(
            "the reranker presets need the `embeddings` extra: "
            "pip install 'mlx-nursery[embeddings]' (mlx-embeddings, GPL-3.0)"
        ) from None

    mx.random.seed(seed)
    # RoBERTa's classifier has no pooler: its head has a dense layer of its own.
    args = module.ModelArgs.from_dict({**config, "add_pooling_layer": prefix != "roberta"})
    encoder: Any = module.Model(args)
    flat: list[tuple[str, mx.array]] = tree_flatten(encoder.parameters())  # type: ignore[assignment]
    arrays = {f"{prefix}.{key}": value for key, value in flat}
    hidden = int(config["hidden_size"])
    scale = hidden**-0.5
    if prefix == "bert":
        arrays["classifier.weight"] = mx.random.normal((1, hidden)) * scale
        arrays["classifier.bias"] = mx.zeros((1,))
    else:
        arrays["classifier.dense.weight"] = mx.random.normal((hidden, hidden)) * scale
        arrays["classifier.dense.bias"] = mx.zeros((hidden,))
        arrays["classifier.out_proj.weight"] = mx.random.normal((1, hidden)) * scale
        arrays["classifier.out_proj.bias"] = mx.zeros((1,))
    arrays = {key: value.astype(dtype) for key, value in sorted(arrays.items())}
    mx.eval(list(arrays.values()))
    mx.save_safetensors(str(out / "model.safetensors"), arrays, metadata={"format": "mlx"})
