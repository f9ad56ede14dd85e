"""/v1/embeddings: a request checked and tokenized into the engine's `EmbeddingRequest`, the
engine's errors in OpenAI's words, and the vectors written as OpenAI writes them.

Limits are OpenAI's: at most 2048 inputs, each within the model's context (a 400 past it:
inputs are never truncated), 300,000 tokens in all. Token-id inputs are embedded as given
(no special tokens added: vLLM's choice too); texts get the tokenizer's special tokens, as
sentence-transformers encodes them. `dimensions` cuts the vector (Matryoshka) only for a
model whose config says it was trained for it (`matryoshka_dimensions`, `is_matryoshka`:
vLLM's keys); for any other model it is a 400, since a cut vector would be silently poor.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from ..engine import (
    Embedder,
    EmbeddingRequest,
)
from ..generation import (
    InvalidRequest,
    ModelCard,
    check_prompt_size,
    engine_errors_as_api_errors,
    structure,
    to_json,
    unknown_model,
)
from ..models import Classifier
from ._embeddings import (
    Embedding,
    EmbeddingList,
    EmbeddingsRequest,
    EmbeddingsUsage,
    EncodingFormat,
)


@attrs.frozen
class EmbeddingLimits:
    max_inputs: int = 2048
    max_tokens: int = 300_000
    """Tokens of all inputs together."""
    max_documents: int = 1000
    """Documents of one /v1/rerank request, texts of each side of one /v1/score request."""


@attrs.frozen
class ServedEmbedder:
    """An embedding model, or a cross-encoder (`classifier` set), as the API presents it."""

    name: str
    aliases: frozenset[str]
    created: int
    tokenizer: Any
    context_length: int
    vocab_size: int
    dimensions: int
    matryoshka: tuple[int, ...] | None
    """Sizes `dimensions` may ask for: None, none; empty, any up to `dimensions`."""
    max_token_bytes: int = 0
    limits: EmbeddingLimits = attrs.field(factory=EmbeddingLimits)
    classifier: Classifier | None = None
    """A cross-encoder's head: it scores pairs (/v1/rerank, /v1/score) and embeds nothing."""

    def check(self, requested: str) -> None:
        if requested != self.name and requested not in self.aliases:
            raise unknown_model(requested, [self.name])

    def card(self) -> ModelCard:
        return ModelCard(
            id=self.name,
            created=self.created,
            context_length=self.context_length,
            kind="embedding" if self.classifier is None else "reranker",
        )


@attrs.frozen
class PreparedEmbeddings:
    request: EmbeddingRequest
    model: str
    encoding_format: EncodingFormat


def prepare_embeddings(body: Any, served: ServedEmbedder) -> PreparedEmbeddings:
    """Validate and tokenize a request body. Raises InvalidRequest naming the parameter.
    Tokenizes: a worker thread."""
    request = structure(body, EmbeddingsRequest)
    served.check(request.model)
    dimensions = _dimensions(request.dimensions, served)
    inputs = _token_inputs(request.input, served)
    return PreparedEmbeddings(
        EmbeddingRequest(inputs, dimensions), request.model, request.encoding_format
    )


def _dimensions(asked: int | None, served: ServedEmbedder) -> int | None:
    if asked is None:
        return None
    if served.matryoshka is None:
        raise InvalidRequest(
            f"The model {served.name!r} does not support 'dimensions': it was not trained "
            "for shortened embeddings (no matryoshka_dimensions in its config).",
            param="dimensions",
            code="unsupported_parameter",
        )
    allowed = served.matryoshka or range(1, served.dimensions + 1)
    if asked not in allowed:
        sizes = ", ".join(map(str, served.matryoshka)) or f"1 to {served.dimensions}"
        raise InvalidRequest(
            f"Invalid 'dimensions': {asked}; the model {served.name!r} supports {sizes}.",
            param="dimensions",
            code="invalid_value",
        )
    return None if asked == served.dimensions else asked


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SHAPES = "a string, or an array of strings, of token ids or of token id arrays"


def _input_items(value: Any) -> tuple[list[Any], bool]:
    """The inputs (strings, token id lists) and whether the request gave a single one.
    Raises InvalidRequest naming the first element of the wrong kind."""
    if isinstance(value, str):
        return [value], True
    if not isinstance(value, list):
        raise InvalidRequest(
            f"Invalid type for 'input': expected {_SHAPES}.", param="input", code="invalid_type"
        )
    if not value:
        raise InvalidRequest("'input' must not be empty.", param="input", code="invalid_value")
    first = value[0]
    kinds: list[tuple[str, Callable[[Any], bool]]] = [
        ("a string", lambda v: isinstance(v, str)),
        ("a token id (an integer)", _is_id),
        ("an array of token ids", lambda v: isinstance(v, list) and all(map(_is_id, v))),
    ]
    for name, fits in kinds:
        if fits(first):
            for index, item in enumerate(value):
                if not fits(item):
                    raise InvalidRequest(
                        f"Invalid type for 'input[{index}]': expected {name}, as input[0] is.",
                        param=f"input[{index}]",
                        code="invalid_type",
                    )
            single = _is_id(first)
            return ([value] if single else list(value)), single
    raise InvalidRequest(
        f"Invalid type for 'input[0]': expected {_SHAPES}.", param="input[0]", code="invalid_type"
    )


def _token_inputs(value: Any, served: ServedEmbedder) -> list[list[int]]:
    """Each input's token ids, checked against the limits."""
    items, single = _input_items(value)
    if len(items) > served.limits.max_inputs:
        raise InvalidRequest(
            f"'input' holds {len(items)} inputs; at most {served.limits.max_inputs} are allowed.",
            param="input",
            code="too_many_items",
        )
    where = ["input"] if single else [f"input[{i}]" for i in range(len(items))]
    texts = [(i, item) for i, item in enumerate(items) if isinstance(item, str)]
    for i, text in texts:
        if not text:
            raise InvalidRequest(
                "'input' cannot be an empty string.", param=where[i], code="invalid_value"
            )
        check_prompt_size(served, [text], where[i])  # type: ignore[arg-type]
    encoded = _encode(served.tokenizer, [text for _, text in texts])
    tokens: list[list[int]] = [[] for _ in items]
    for (i, _), ids in zip(texts, encoded, strict=True):
        tokens[i] = ids
    total = 0
    for i, item in enumerate(items):
        if not isinstance(item, str):
            tokens[i] = _checked_ids(item, served.vocab_size, where[i])
        if len(tokens[i]) > served.context_length:
            raise InvalidRequest(
                f"This model's maximum context length is {served.context_length} tokens, "
                f"however you requested {len(tokens[i])} tokens in {where[i]}. Please reduce "
                "the input's length.",
                param=where[i],
                code="context_length_exceeded",
            )
        total += len(tokens[i])
    if total > served.limits.max_tokens:
        raise InvalidRequest(
            f"The inputs hold {total} tokens in all; at most {served.limits.max_tokens} are "
            "allowed in one request.",
            param="input",
            code="too_many_tokens",
        )
    return tokens


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]


def _checked_ids(ids: Sequence[int], vocab_size: int, where: str) -> list[int]:
    if not ids:
        raise InvalidRequest("A token array cannot be empty.", param=where, code="invalid_value")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequest(
            f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})",
            param=where,
            code="invalid_value",
        )
    return list(ids)


async def run_embeddings(embedder: Embedder, request: EmbeddingRequest) -> list[np.ndarray]:
    """The engine's vectors for `request`, its errors as OpenAI errors: 503 (at capacity,
    with Retry-After; not serving), 500 when the model failed on the batch.

    Cancellation: as `Embedder.embed`: the compute has stopped when it returns."""
    with engine_errors_as_api_errors():
        return await embedder.embed(request)


def embeddings_body(prepared: PreparedEmbeddings, vectors: list[np.ndarray]) -> bytes:
    """The response body. Vectors as floats, or base64 of their little-endian float32
    bytes (what OpenAI's SDK decodes). Building it is linear in the floats (a second for
    millions): a worker thread."""
    data = [
        Embedding("embedding", _encoded(vector, prepared.encoding_format), index)
        for index, vector in enumerate(vectors)
    ]
    tokens = prepared.request.tokens
    body = EmbeddingList("list", data, prepared.model, EmbeddingsUsage(tokens, tokens))
    return json.dumps(to_json(body)).encode()


def _encoded(vector: np.ndarray, encoding: EncodingFormat) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()  # type: ignore[no-any-return]
