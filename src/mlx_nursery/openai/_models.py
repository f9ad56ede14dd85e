"""/v1/models: the model cards we send back."""

from __future__ import annotations

from typing import Literal

import attrs


@attrs.frozen
class ModelCard:
    id: str
    created: int
    context_length: int
    owned_by: str = "mlx-nursery"
    object: Literal["model"] = "model"


@attrs.frozen
class ModelList:
    data: list[ModelCard]
    object: Literal["list"] = "list"
