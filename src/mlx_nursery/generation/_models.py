"""/v1/models: the model cards we send back."""

from __future__ import annotations

from typing import Literal

import attrs

ModelKindName = Literal["text", "vision", "speech", "embedding", "reranker"]


def input_modalities(kind: str) -> list[str]:
    """What a request may give a model of `kind` (the loader's: "lm", "vlm", "stt",
    "embedding", "reranker", "scripted"): text; text and images for a vision model; audio
    for a speech model."""
    return {"vlm": ["text", "image"], "stt": ["audio"]}.get(kind, ["text"])


def card_kind(kind: str) -> ModelKindName:
    """The model list's name for a loader's kind."""
    names = {"vlm": "vision", "stt": "speech", "embedding": "embedding", "reranker": "reranker"}
    return names.get(kind, "text")  # type: ignore[return-value]


@attrs.frozen
class ModelCard:
    id: str
    created: int
    context_length: int
    input_modalities: list[str] = attrs.Factory(lambda: ["text"])
    """What a request may give the model: "text", and "image" for a vision model (not
    OpenAI's: local servers list what each model takes beside `context_length`)."""
    kind: ModelKindName = "text"
    """What the model does (not OpenAI's): "text" and "vision" models answer the text APIs,
    "speech" models (Whisper) /v1/audio/transcriptions and /v1/audio/translations,
    "embedding" models /v1/embeddings (and /v1/rerank and /v1/score, by cosine similarity),
    "reranker" models (cross-encoders) /v1/rerank and /v1/score. Each refuses the others'
    routes with a 400."""
    loaded: bool = True
    """Whether the model is in memory now (not OpenAI's): a request for one that is not
    loads it first, which takes a while (see `--max-loaded-models`)."""
    owned_by: str = "mlx-nursery"
    object: Literal["model"] = "model"


@attrs.frozen
class ModelList:
    data: list[ModelCard]
    object: Literal["list"] = "list"
