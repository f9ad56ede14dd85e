"""Write loadable embedding model directories offline (random weights, BERT).

The layout is a sentence-transformers checkpoint's, as served models come: the encoder's
`config.json` and weights (mlx-embeddings' BERT class names and shapes), a tokenizer that
brackets every text in `[CLS] ... [SEP]`, and the sentence-transformers files that say how
token states become one vector (`modules.json`, `1_Pooling/config.json`, a Normalize step)
and how long an input may be (`sentence_bert_config.json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from tokenizers import processors

from ._tokenizer_factory import build_tokenizer

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_embedding_model(out: Path, preset: Any, dtype: str, seed: int) -> None:
    """Write `preset` (an embedding `Preset`) into `out`: config, weights, tokenizer and
    the sentence-transformers pooling files."""
    context_length = int(preset.config["max_position_embeddings"])
    ids = _write_tokenizer(out, preset.trained_vocab, preset.vocab_size, context_length)
    config = dict(preset.config)
    config.update(pad_token_id=ids["[PAD]"], torch_dtype=dtype, mlx_nursery_preset=preset.name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    _write_sentence_transformers(out, preset.embedding, int(config["hidden_size"]))
    _write_weights(out, config, getattr(mx, dtype), seed)


def _write_tokenizer(
    out: Path, trained_vocab: int, vocab_size: int, context_length: int
) -> dict[str, int]:
    tokenizer = build_tokenizer(trained_vocab, vocab_size, SPECIAL_TOKENS)
    ids: dict[str, int] = {}
    for token in SPECIAL_TOKENS:
        found = tokenizer.token_to_id(token)
        assert found is not None, f"{token} is one of the trained special tokens"
        ids[token] = found
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    spec = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    for i in range(max(vocab.values()) + 1, vocab_size):
        vocab[f"<filler_{i}>"] = i
    (out / "tokenizer.json").write_text(
        json.dumps(spec, ensure_ascii=False, sort_keys=True), "utf-8"
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True), "utf-8"
    )
    return ids


def _write_sentence_transformers(out: Path, embedding: dict[str, Any], dimension: int) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if embedding.get("normalize", True):
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
        (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "modules.json").write_text(json.dumps(modules, indent=2), "utf-8")
    mode = embedding.get("pooling", "mean")
    pooling = {
        "word_embedding_dimension": dimension,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": mode == "last",
        "include_prompt": True,
    }
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2), "utf-8")
    settings = {"max_seq_length": embedding.get("max_seq_length"), "do_lower_case": False}
    (out / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2), "utf-8")
    (out / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}),
        "utf-8",
    )


def _write_weights(out: Path, config: dict[str, Any], dtype: mx.Dtype, seed: int) -> None:
    try:
        from mlx_embeddings.models import bert
    except ImportError:
        raise ModuleNotFoundError(
            "the embedding presets need the `embeddings` extra: "
            "pip install 'mlx-nursery[embeddings]' (mlx-embeddings, GPL-3.0)"
        ) from None

    mx.random.seed(seed)
    model: Any = bert.Model(bert.ModelArgs.from_dict(config))
    model.set_dtype(dtype)
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    arrays = dict(sorted(flat, key=lambda kv: kv[0]))
    mx.eval(list(arrays.values()))
    mx.save_safetensors(str(out / "model.safetensors"), arrays, metadata={"format": "mlx"})
