"""/v1/models: the model cards we send back."""

from __future__ import annotations

import datetime
from typing import Any, Literal

import attrs

from ._converter import register_unstructure_hook, unstructure_fields

ModelKindName = Literal["text", "vision", "speech", "speech-synthesis", "embedding", "reranker"]


def input_modalities(kind: str) -> list[str]:
    """What a request may give a model of `kind` (the loader's: "lm", "vlm", "stt", "tts",
    "embedding", "reranker", "scripted"): text; text and images for a vision model; audio
    for a speech model (text, for a text-to-speech one)."""
    return {"vlm": ["text", "image"], "stt": ["audio"]}.get(kind, ["text"])


def card_kind(kind: str) -> ModelKindName:
    """The model list's name for a loader's kind."""
    names = {
        "vlm": "vision",
        "stt": "speech",
        "tts": "speech-synthesis",
        "embedding": "embedding",
        "reranker": "reranker",
    }
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
    "speech-synthesis" models (KittenTTS, Kokoro) /v1/audio/speech, "embedding" models
    /v1/embeddings (and /v1/rerank and /v1/score, by cosine similarity), "reranker" models
    (cross-encoders) /v1/rerank and /v1/score. Each refuses the others' routes with a 400."""
    voices: list[str] | None = None
    """A speech-synthesis model's voices, the `voice` values /v1/audio/speech takes (not
    OpenAI's; None for other kinds, and left out of the card then)."""
    loaded: bool = True
    """Whether the model is in memory now (not OpenAI's): a request for one that is not
    loads it first, which takes a while (see `--max-loaded-models`)."""
    owned_by: str = "mlx-nursery"
    object: Literal["model"] = "model"
    root: str | None = None
    """A LoRA adapter's base model (vLLM's field; left out for a model that is no adapter)."""
    parent: str | None = None
    """A LoRA adapter's base model, as vLLM names it in `parent` (left out otherwise)."""


_card_fields = unstructure_fields(ModelCard)


def _card(card: ModelCard) -> dict[str, Any]:
    """The card's JSON, without the fields only some kinds have where this one has none
    (an adapter's base, a speech-synthesis model's voices); with Anthropic's fields beside
    OpenAI's (its SDK reads the same route: `type`, `display_name`, `created_at`)."""
    data = _card_fields(card)
    for key in ("root", "parent", "voices"):
        if data[key] is None:
            del data[key]
    created = datetime.datetime.fromtimestamp(card.created, datetime.UTC)
    data.update(
        type="model",
        display_name=card.id,
        created_at=created.isoformat().replace("+00:00", "Z"),
    )
    return data


register_unstructure_hook(ModelCard, _card)


@attrs.frozen
class ModelList:
    """OpenAI's list, with Anthropic's paging fields beside (one page, always)."""

    data: list[ModelCard]
    object: Literal["list"] = "list"
    has_more: bool = False
    first_id: str | None = attrs.field(
        default=attrs.Factory(lambda self: self.data[0].id if self.data else None, True)
    )
    last_id: str | None = attrs.field(
        default=attrs.Factory(lambda self: self.data[-1].id if self.data else None, True)
    )
