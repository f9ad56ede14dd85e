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

import attrs
import mlx.core as mx
from mlx.utils import tree_flatten
from tokenizers import processors

from ._tokenizer_factory import build_tokenizer


@attrs.frozen
class TokenizerFamily:
    """An encoder family's special tokens (in id order from 0) and how it frames texts."""

    special: tuple[str, ...]
    single: str
    pair: str
    """`tokenizers`' template: a pair's texts, and their token types (`:1`)."""
    roles: dict[str, str]
    """tokenizer_config.json's names for the special tokens."""


BERT = TokenizerFamily(
    ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    "[CLS] $A [SEP]",
    "[CLS] $A [SEP] $B:1 [SEP]:1",
    {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    },
)
ROBERTA = TokenizerFamily(
    # <pad> is id 1, as XLM-RoBERTa's config says (its positions count from the padding id).
    ("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
    "<s> $A </s>",
    "<s> $A </s> </s> $B </s>",
    {
        "bos_token": "<s>",
        "cls_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
    },
)


def write_embedding_model(out: Path, preset: Any, dtype: str, seed: int) -> None:
    """Write `preset` (an embedding `Preset`) into `out`: config, weights, tokenizer and
    the sentence-transformers pooling files."""
    context_length = int(preset.config["max_position_embeddings"])
    ids = write_encoder_tokenizer(out, preset.trained_vocab, preset.vocab_size, context_length)
    config = dict(preset.config)
    config.update(pad_token_id=ids["[PAD]"], torch_dtype=dtype, mlx_nursery_preset=preset.name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    _write_sentence_transformers(out, preset.embedding, int(config["hidden_size"]))
    _write_weights(out, config, getattr(mx, dtype), seed)


def write_encoder_tokenizer(
    out: Path,
    trained_vocab: int,
    vocab_size: int,
    context_length: int,
    family: TokenizerFamily = BERT,
) -> dict[str, int]:
    """tokenizer.json and tokenizer_config.json of an encoder `family`: a byte-level BPE
    trained here, framing texts and pairs as the family does. Returns the special ids."""
    special = list(family.special)
    tokenizer = build_tokenizer(trained_vocab, vocab_size, special)
    ids: dict[str, int] = {}
    for token in special:
        found = tokenizer.token_to_id(token)
        assert found is not None, f"{token} is one of the trained special tokens"
        ids[token] = found
    named = {word.split(":")[0] for word in f"{family.single} {family.pair}".split()}
    framing = [(t, ids[t]) for t in special if t in named]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=family.single, pair=family.pair, special_tokens=framing
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
        **family.roles,
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
