"""Embedding models: how a checkpoint is known to be one, how its vectors are made, loading.

The architectures come from mlx-embeddings (BERT, XLM-RoBERTa, ModernBERT, Qwen3, Gemma3
and others): their forward gives the last hidden states. Pooling and normalization are ours,
read from the checkpoint's sentence-transformers files as sentence-transformers and vLLM
read them, because mlx-embeddings' own `text_embeds` pools one fixed way per architecture
(always the mean for BERT, which is wrong for CLS-pooled models such as BGE).

Without sentence-transformers files, the defaults are vLLM's: an encoder pools its first
([CLS]) token, a decoder its last; the vector is normalized.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import attrs

PoolingMode = Literal["cls", "mean", "last"]
Activation = Literal["sigmoid", "identity"]

ENCODER_TYPES = frozenset({"bert", "xlm-roberta", "xlm_roberta", "modernbert"})
"""Architectures that only embed (mlx-lm cannot generate with them)."""
_ST_MARKERS = ("modules.json", "config_sentence_transformers.json")
_ST_MODULE = "sentence_transformers.models."
_MODES: dict[str, PoolingMode] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}


class EmbeddingConfigError(ValueError):
    """The checkpoint asks for an embedding pipeline this server does not implement."""


@attrs.frozen
class Classifier:
    """A cross-encoder's head (`_cross_encoder.py`): one label, whose logit scores a pair."""

    activation: Activation
    """What makes a logit its score by default (sentence-transformers' for one label)."""
    token_types: bool
    """Whether the model tells a pair's two texts apart by token type (BERT; not RoBERTa)."""


@attrs.frozen
class EmbeddingSpec:
    """How the model's token states become one vector, and what a request may ask of it.

    A cross-encoder's spec (`classifier` set) says how it reads its inputs (their length,
    padding) and how its head scores them: its forward gives one logit per input (a pair),
    not token states, and `pooling`, `normalize` and `matryoshka` do not apply."""

    pooling: PoolingMode
    normalize: bool
    dimensions: int
    """The vector's full size (the hidden size)."""
    context_length: int
    """Tokens per input: the position embeddings', or sentence-transformers' max_seq_length."""
    matryoshka: tuple[int, ...] | None
    """Sizes a vector may be cut to (`dimensions` in a request): None, none (the model was
    not trained for it); empty, any size up to `dimensions`."""
    pad_token_id: int
    vocab_size: int
    """Rows of the token embedding table: a token id must be below it."""
    classifier: Classifier | None = None


def is_embedding_model(path: Path, config: dict[str, Any]) -> bool:
    """A sentence-transformers checkpoint, or an architecture that only embeds."""
    if str(config.get("model_type", "")).lower() in ENCODER_TYPES:
        return True
    return any((path / marker).is_file() for marker in _ST_MARKERS)


def embedding_spec(path: Path, config: dict[str, Any]) -> EmbeddingSpec:
    """Read `path`'s pooling, normalization, input length and Matryoshka sizes. Raises
    EmbeddingConfigError for a pipeline step not implemented (a Dense projection, max
    pooling, ...): served without it, the vectors would be silently wrong."""
    encoder = str(config.get("model_type", "")).lower() in ENCODER_TYPES
    pooling: PoolingMode = "cls" if encoder else "last"
    normalize = True
    modules = _read_json(path / "modules.json")
    if isinstance(modules, list):
        normalize = False
        for module in modules:
            kind = str(module.get("type", "")).removeprefix(_ST_MODULE)
            if kind == "Pooling":
                pooling = _pooling_mode(path / str(module.get("path", "")) / "config.json")
            elif kind == "Normalize":
                normalize = True
            elif kind != "Transformer":
                raise EmbeddingConfigError(f"{path}: sentence-transformers module {kind!r}")
    hidden = int(config["hidden_size"])
    context = embedding_input_length(path, config)
    sizes = config.get("matryoshka_dimensions")
    matryoshka: tuple[int, ...] | None = None
    if isinstance(sizes, list) and sizes:
        matryoshka = tuple(sorted({int(s) for s in sizes if 0 < int(s) <= hidden}))
    elif config.get("is_matryoshka") is True:
        matryoshka = ()
    pad = config.get("pad_token_id")
    return EmbeddingSpec(
        pooling,
        normalize,
        hidden,
        context,
        matryoshka,
        int(pad) if isinstance(pad, int) else 0,
        int(config["vocab_size"]),
    )


def _pooling_mode(file: Path) -> PoolingMode:
    settings = _read_json(file)
    if not isinstance(settings, dict):
        raise EmbeddingConfigError(f"{file}: no pooling settings")
    chosen = [key for key, value in settings.items() if key.startswith("pooling_mode") and value]
    if len(chosen) != 1 or chosen[0] not in _MODES:
        raise EmbeddingConfigError(f"{file}: pooling {chosen} (served: cls, mean or last token)")
    return _MODES[chosen[0]]


def embedding_input_length(path: Path, config: dict[str, Any]) -> int:
    """Tokens one input may have. Reads files: a worker thread."""
    positions = int(config.get("max_position_embeddings", 512))
    if str(config.get("model_type", "")).replace("_", "-") == "xlm-roberta":
        positions -= 2  # RoBERTa's positions start after the padding index
    settings = _read_json(path / "sentence_bert_config.json")
    longest = settings.get("max_seq_length") if isinstance(settings, dict) else None
    return min(positions, longest) if isinstance(longest, int) and longest > 0 else positions


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise EmbeddingConfigError(f"{file}: unreadable ({exc})") from exc


def load_embedding_parts(path: Path, config: dict[str, Any]) -> tuple[Any, Any, EmbeddingSpec]:
    """mlx-embeddings' model (weights evaluated), the Hugging Face tokenizer, the spec.
    Makes MLX calls: the engine thread only. Never reaches a hub: `path` is local."""
    from transformers import AutoTokenizer

    try:
        from mlx_embeddings.utils import load_model
    except ImportError:
        raise EmbeddingConfigError(
            "embedding models need the `embeddings` extra: pip install 'mlx-nursery[embeddings]'"
            " (mlx-embeddings, GPL-3.0)"
        ) from None

    spec = embedding_spec(path, config)
    model = load_model(path, path_to_repo=str(path))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer, spec
