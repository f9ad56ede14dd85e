"""/v1/rerank and /v1/score: the requests we accept and the objects we send back, in vLLM's
shapes (its `RerankRequest` / `ScoreRequest`, themselves Jina's and sentence-transformers'
CrossEncoder's), text only.

Beside vLLM's fields a rerank request may say `return_documents` (Jina's and Cohere's name):
false leaves each result's `document` out; vLLM always sends it, as the default here does.
"""

from __future__ import annotations

from typing import Literal

import attrs


@attrs.frozen
class RerankDocument:
    text: str


@attrs.define(kw_only=True)
class RerankRequest:
    model: str
    query: str
    documents: list[str | RerankDocument]
    """Texts, or Cohere's and Jina's `{"text": ...}` objects."""
    top_n: int | None = None
    """The best `top_n` results (None or 0: all of them, vLLM's 0)."""
    return_documents: bool = True
    truncate_prompt_tokens: int | None = None
    """Cut each input to this many tokens (-1: the model's length) rather than refusing one
    that is longer; a pair loses tokens from its longer text first."""
    use_activation: bool | None = None
    """A cross-encoder's score: its logit through the model's activation (sigmoid, unless its
    config names another; None or true), or the raw logit (false)."""


@attrs.define(kw_only=True)
class ScoreRequest:
    model: str
    text_1: str | list[str]
    text_2: str | list[str]
    """Scored against `text_1`'s one text (1:1, 1:N), or each against its own (N:N)."""
    truncate_prompt_tokens: int | None = None
    use_activation: bool | None = None


@attrs.frozen
class RerankResult:
    index: int
    document: RerankDocument | None
    """Left out of the body when the request says `return_documents: false`."""
    relevance_score: float


@attrs.frozen
class RerankUsage:
    total_tokens: int


@attrs.frozen
class RerankResponse:
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
    """Best first; ties keep the documents' order."""


@attrs.frozen
class ScoreData:
    index: int
    object: Literal["score"]
    score: float


@attrs.frozen
class ScoreUsage:
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


@attrs.frozen
class ScoreResponse:
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage
