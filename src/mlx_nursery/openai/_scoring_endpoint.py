"""/v1/rerank and /v1/score (vLLM's shapes): a request checked and tokenized into the engine's
`EmbeddingRequest`, its scores made from the engine's rows, the bodies.

A cross-encoder (a reranker) reads each (query, document) pair framed as one input; its score
is the head's logit through the model's activation (sigmoid for one label, as
sentence-transformers' CrossEncoder and vLLM give it: a relevance in (0, 1)), or the raw
logit with `use_activation: false`. An embedding model embeds each text once and a pair's
score is the cosine similarity of its two vectors (vLLM's rule), in [-1, 1]; it has no
activation, so `use_activation` is refused there.

Pairs: a rerank's query with each document; a score's `text_1` and `text_2` as vLLM pairs
them (1:1, 1:N, or N:N; anything else is a 400). Usage counts the tokens the model read: each
pair's for a cross-encoder, each text's once for an embedding model. At most
`--max-rerank-documents` documents (or texts on either side of a score).
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
import numpy as np

from ..engine import EmbeddingRequest
from ..generation import InvalidRequest, new_id, now, structure, to_json
from ..models import Activation
from ._embeddings_endpoint import ServedEmbedder
from ._scoring import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    ScoreUsage,
)
from ._scoring_inputs import Text, encode_pairs, encode_texts, truncation_limit


@attrs.frozen
class Scoring:
    """What the engine computes for a request, and how its rows become the pairs' scores."""

    request: EmbeddingRequest
    pairs: list[tuple[int, int]] | None
    """An embedding model's: each pair's rows (query, document), scored by cosine. None: a
    cross-encoder's, one row (its logits) per pair."""
    activation: Activation | None
    """What makes a cross-encoder's logit its score (None: the logit itself)."""

    def scores(self, rows: list[np.ndarray]) -> list[float]:
        if self.pairs is None:
            return [_activated(float(row[0]), self.activation) for row in rows]
        return [_cosine(rows[a], rows[b]) for a, b in self.pairs]


def _activated(logit: float, activation: Activation | None) -> float:
    if activation != "sigmoid":
        return logit
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    exp = math.exp(logit)
    return exp / (1.0 + exp)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    return float(a64 @ b64) / max(norms, 1e-12)


@attrs.frozen
class PreparedRerank:
    scoring: Scoring
    model: str
    documents: list[str]
    top_n: int
    return_documents: bool


@attrs.frozen
class PreparedScore:
    scoring: Scoring
    model: str


def prepare_rerank(body: Any, served: ServedEmbedder) -> PreparedRerank:
    """Validate and tokenize a /v1/rerank body. Raises InvalidRequest naming the parameter.
    Tokenizes: a worker thread."""
    request = structure(body, RerankRequest)
    served.check(request.model)
    documents = [d if isinstance(d, str) else d.text for d in request.documents]
    _check_count(documents, "documents", served)
    if request.top_n is not None and request.top_n < 0:
        raise InvalidRequest(
            f"Invalid 'top_n': {request.top_n}; expected 0 (all) or more.",
            param="top_n",
            code="invalid_value",
        )
    scoring = _scoring(
        served,
        [(request.query, "query")],
        [(text, f"documents[{i}]") for i, text in enumerate(documents)],
        request.truncate_prompt_tokens,
        request.use_activation,
    )
    top_n = min(request.top_n or len(documents), len(documents))
    return PreparedRerank(scoring, request.model, documents, top_n, request.return_documents)


def prepare_score(body: Any, served: ServedEmbedder) -> PreparedScore:
    """Validate and tokenize a /v1/score body. Raises InvalidRequest naming the parameter.
    Tokenizes: a worker thread."""
    request = structure(body, ScoreRequest)
    served.check(request.model)
    first, second = _side(request.text_1, "text_1"), _side(request.text_2, "text_2")
    for side, name in ((first, "text_1"), (second, "text_2")):
        _check_count(side, name, served)
    if len(first) > 1 and len(first) != len(second):
        raise InvalidRequest(
            f"'text_1' holds {len(first)} texts and 'text_2' {len(second)}: the pairs are "
            "1:1, 1:N (one text_1 for every text_2) or N:N (as many of each).",
            param="text_2",
            code="invalid_value",
        )
    scoring = _scoring(
        served, first, second, request.truncate_prompt_tokens, request.use_activation
    )
    return PreparedScore(scoring, request.model)


def _side(value: str | list[str], name: str) -> list[Text]:
    if isinstance(value, str):
        return [(value, name)]
    return [(text, f"{name}[{i}]") for i, text in enumerate(value)]


def _check_count(items: list[Any], name: str, served: ServedEmbedder) -> None:
    if not items:
        raise InvalidRequest(f"'{name}' must not be empty.", param=name, code="invalid_value")
    most = served.limits.max_documents
    if len(items) > most:
        raise InvalidRequest(
            f"'{name}' holds {len(items)} texts; at most {most} are allowed.",
            param=name,
            code="too_many_items",
        )


def _scoring(
    served: ServedEmbedder,
    queries: list[Text],
    documents: list[Text],
    truncate: int | None,
    use_activation: bool | None,
) -> Scoring:
    """The engine's inputs for the pairs of `queries` (one, or one per document) and
    `documents`, and how their rows become scores."""
    classifier = served.classifier
    limit = truncation_limit(truncate, served, pair=classifier is not None)
    if classifier is not None:
        encoded = encode_pairs(served, queries, documents, limit)
        request = EmbeddingRequest(encoded.ids, token_types=encoded.types)
        activation = None if use_activation is False else classifier.activation
        return Scoring(request, None, activation)
    if use_activation is not None:
        raise InvalidRequest(
            f"The model {served.name!r} is an embedding model: its scores are cosine "
            "similarities, which have no activation to turn on or off.",
            param="use_activation",
            code="unsupported_parameter",
        )
    encoded = encode_texts(served, [*queries, *documents], limit)
    count = len(queries)
    pairs = [(0 if count == 1 else i, count + i) for i in range(len(documents))]
    return Scoring(EmbeddingRequest(encoded.ids), pairs, None)


def rerank_body(prepared: PreparedRerank, rows: list[np.ndarray]) -> bytes:
    """The /v1/rerank body: the best `top_n` documents, best first. A worker thread."""
    scores = prepared.scoring.scores(rows)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: prepared.top_n]
    results = [
        RerankResult(
            index,
            RerankDocument(prepared.documents[index]) if prepared.return_documents else None,
            scores[index],
        )
        for index in order
    ]
    usage = RerankUsage(prepared.scoring.request.tokens)
    body = RerankResponse(new_id("rerank"), prepared.model, usage, results)
    return json.dumps(to_json(body)).encode()


def score_body(prepared: PreparedScore, rows: list[np.ndarray]) -> bytes:
    """The /v1/score body: one score per pair, in the pairs' order. A worker thread."""
    scores = prepared.scoring.scores(rows)
    data = [ScoreData(index, "score", score) for index, score in enumerate(scores)]
    tokens = prepared.scoring.request.tokens
    body = ScoreResponse(
        new_id("score"), "list", now(), prepared.model, data, ScoreUsage(tokens, tokens)
    )
    return json.dumps(to_json(body)).encode()
