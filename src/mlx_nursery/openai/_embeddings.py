"""/v1/embeddings: the request we accept and the objects we send back (OpenAI's order)."""

from __future__ import annotations

from typing import Any, Literal

import attrs

EncodingFormat = Literal["float", "base64"]


@attrs.define(kw_only=True)
class EmbeddingsRequest:
    input: Any
    """A string, or an array of strings, of token ids, or of token id arrays: checked by
    `_embeddings_endpoint` (the converter's union error could not say which element of a
    mixed array is wrong)."""
    model: str
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    user: str | None = None
    """An end user's id, for the caller's own tracing: nothing here depends on it."""


@attrs.frozen
class Embedding:
    object: Literal["embedding"]
    embedding: list[float] | str
    """The floats, or with `encoding_format: "base64"` their little-endian float32 bytes."""
    index: int


@attrs.frozen
class EmbeddingsUsage:
    prompt_tokens: int
    total_tokens: int


@attrs.frozen
class EmbeddingList:
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
