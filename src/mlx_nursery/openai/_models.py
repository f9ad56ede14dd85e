"""/v1/models: the model cards we send back."""

from __future__ import annotations

from typing import Literal

import attrs


def input_modalities(vision: bool) -> list[str]:
    """What a request may give a model: text, and images for a vision model."""
    return ["text", "image"] if vision else ["text"]


@attrs.frozen
class ModelCard:
    id: str
    created: int
    context_length: int
    input_modalities: list[str] = attrs.Factory(lambda: ["text"])
    """What a request may give the model: "text", and "image" for a vision model (not
    OpenAI's: local servers list what each model takes beside `context_length`)."""
    kind: Literal["generation", "embedding"] = "generation"
    """What the model does (not OpenAI's): "generation" for chat, completions and Responses;
    "embedding" for /v1/embeddings. Each refuses the other's routes with a 400."""
    loaded: bool = True
    """Whether the model is in memory now (not OpenAI's): a request for one that is not
    loads it first, which takes a while (see `--max-loaded-models`)."""
    owned_by: str = "mlx-nursery"
    object: Literal["model"] = "model"


@attrs.frozen
class ModelList:
    data: list[ModelCard]
    object: Literal["list"] = "list"
