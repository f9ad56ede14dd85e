"""Cross-encoders (rerankers): how a checkpoint is known to be one, its head, loading.

A cross-encoder reads a query and a document together and gives one logit: the pair's
relevance. The checkpoints are Hugging Face's `BertForSequenceClassification` (ms-marco
MiniLM and the like) and `XLMRobertaForSequenceClassification` (BAAI's bge-reranker-base,
-large, -v2-m3) with one label. mlx-embeddings implements both encoders but not their
classification heads (only ModernBERT's), so the heads are here, on its encoders, named as
the checkpoints name their weights (`bert.` / `roberta.` and `classifier.`): the files load
as they are, strictly, with no renaming.

- BERT: the encoder's pooler (dense + tanh on the [CLS] state), then `classifier` (linear).
- XLM-RoBERTa: no pooler; `classifier.dense` + tanh, then `classifier.out_proj`, on <s>.

The score of a logit is sentence-transformers' (`CrossEncoder`, one label): its sigmoid,
unless the checkpoint's config names another activation (`sentence_transformers.
activation_fn`, which sentence-transformers writes): vLLM's rule too.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx.nn.layers.linear import Linear

from ._embedding_loading import (
    ENCODER_TYPES,
    Activation,
    Classifier,
    EmbeddingConfigError,
    EmbeddingSpec,
    embedding_input_length,
)

_HEADED = {"bert": "bert", "xlm-roberta": "xlm_roberta"}
"""Encoders whose classification head is served -> mlx-embeddings' module of the encoder."""
_ACTIVATIONS: dict[str, Activation] = {"Sigmoid": "sigmoid", "Identity": "identity"}


def _model_type(config: dict[str, Any]) -> str:
    return str(config.get("model_type", "")).lower().replace("_", "-")


def is_cross_encoder(config: dict[str, Any]) -> bool:
    """An encoder architecture with a sequence-classification head (served or not: one
    that is not is refused at load rather than served as an embedding model)."""
    architectures = config.get("architectures") or []
    return str(config.get("model_type", "")).lower() in ENCODER_TYPES and any(
        str(a).endswith("ForSequenceClassification") for a in architectures
    )


def _labels(config: dict[str, Any]) -> int:
    """Hugging Face's count: `id2label`'s size, else `num_labels`, else its default of 2."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    labels = config.get("num_labels")
    return int(labels) if isinstance(labels, int) else 2


def _activation(config: dict[str, Any]) -> Activation:
    settings = config.get("sentence_transformers")
    named = settings.get("activation_fn") if isinstance(settings, dict) else None
    if named is None:
        return "sigmoid"
    activation = _ACTIVATIONS.get(str(named).rsplit(".", 1)[-1])
    if activation is None:
        raise EmbeddingConfigError(f"the activation {named!r} (served: Sigmoid, Identity)")
    return activation


def cross_encoder_spec(path: Path, config: dict[str, Any]) -> EmbeddingSpec:
    """Read `path`'s input length, padding and head. Raises EmbeddingConfigError for a
    head that is not a reranker's (more than one label), an encoder whose head is not
    served, or a quantized checkpoint."""
    kind = _model_type(config)
    if kind not in _HEADED:
        raise EmbeddingConfigError(
            f"{path}: a {config.get('model_type')!r} sequence classifier (served: BERT and "
            "XLM-RoBERTa cross-encoders)"
        )
    labels = _labels(config)
    if labels != 1:
        raise EmbeddingConfigError(
            f"{path}: a classifier of {labels} labels; a reranker's head has one (its logit "
            "is the pair's relevance)"
        )
    if "quantization" in config or "quantization_config" in config:
        raise EmbeddingConfigError(f"{path}: a quantized cross-encoder")
    pad = config.get("pad_token_id")
    return EmbeddingSpec(
        pooling="cls",
        normalize=False,
        dimensions=1,
        context_length=embedding_input_length(path, config),
        matryoshka=None,
        pad_token_id=int(pad) if isinstance(pad, int) else 0,
        vocab_size=int(config["vocab_size"]),
        classifier=Classifier(
            _activation(config), token_types=int(config.get("type_vocab_size", 2)) > 1
        ),
    )


class BertCrossEncoder(Module):
    """mlx-embeddings' BERT, its pooler, and `classifier`: logits (batch, labels)."""

    def __init__(self, encoder: Module, hidden: int, labels: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.bert = encoder
        self.classifier = Linear(hidden, labels)

    def __call__(
        self, input_ids: mx.array, attention_mask: mx.array, token_type_ids: mx.array | None
    ) -> mx.array:
        output = self.bert(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        logits: mx.array = self.classifier(output.pooler_output)
        return logits


class _RobertaHead(Module):
    def __init__(self, hidden: int, labels: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.dense = Linear(hidden, hidden)
        self.out_proj = Linear(hidden, labels)

    def __call__(self, first: mx.array) -> mx.array:
        logits: mx.array = self.out_proj(mx.tanh(self.dense(first)))
        return logits


class XLMRobertaCrossEncoder(Module):
    """mlx-embeddings' XLM-RoBERTa (no pooler) and RoBERTa's head on the <s> state."""

    def __init__(self, encoder: Module, hidden: int, labels: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.roberta = encoder
        self.classifier = _RobertaHead(hidden, labels)

    def __call__(
        self, input_ids: mx.array, attention_mask: mx.array, token_type_ids: mx.array | None
    ) -> mx.array:
        output = self.roberta(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        logits: mx.array = self.classifier(output.last_hidden_state[:, 0])
        return logits


def build_cross_encoder(config: dict[str, Any]) -> Module:
    """The checkpoint's architecture, with fresh weights: mlx-embeddings' encoder (imported
    here: the `embeddings` extra) under the head. Makes MLX calls: the engine thread."""
    kind = _model_type(config)
    try:
        module = importlib.import_module(f"mlx_embeddings.models.{_HEADED[kind]}")
    except ImportError:
        raise EmbeddingConfigError(
            "cross-encoders need the `embeddings` extra: pip install 'mlx-nursery[embeddings]'"
            " (mlx-embeddings, GPL-3.0)"
        ) from None
    hidden, labels = int(config["hidden_size"]), _labels(config)
    if kind == "bert":
        return BertCrossEncoder(module.Model(module.ModelArgs.from_dict(config)), hidden, labels)
    args = module.ModelArgs.from_dict({**config, "add_pooling_layer": False})
    return XLMRobertaCrossEncoder(module.Model(args), hidden, labels)


def load_cross_encoder_parts(path: Path, config: dict[str, Any]) -> tuple[Any, Any, EmbeddingSpec]:
    """The model (weights loaded strictly and evaluated, in inference mode), the Hugging
    Face tokenizer, the spec. Raises EmbeddingConfigError for a checkpoint not served,
    ValueError for weights that do not match the architecture. Makes MLX calls: the engine
    thread. Never reaches a hub: `path` is local."""
    from transformers import AutoTokenizer

    spec = cross_encoder_spec(path, config)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise EmbeddingConfigError(f"{path}: no *.safetensors weights")
    weights: dict[str, mx.array] = {}
    for file in files:
        loaded: dict[str, mx.array] = mx.load(str(file))  # type: ignore[assignment]
        weights.update({k: v for k, v in loaded.items() if not k.endswith("position_ids")})
    model = build_cross_encoder(config)
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())  # type: ignore[no-untyped-call]
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer, spec
