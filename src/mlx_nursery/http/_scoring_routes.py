"""/v1/rerank and /v1/score (and /rerank, /score, vLLM's paths without the version): as
/v1/embeddings does, check and read the body, prepare it on a worker thread (validation and
tokenizing), compute on the model's engine in the request's scope (a cross-encoder's pairs,
or an embedding model's texts), write the body on a worker thread.

Cancellation: the compute runs in the handler's own scope (`EmbeddingCalls.run`): a client
that leaves, the deadline or the drain stop it before the engine's next forward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from quart import Response

from ..generation import parse_json
from ..openai import (
    PreparedRerank,
    PreparedScore,
    ServedEmbedder,
    prepare_rerank,
    prepare_score,
    rerank_body,
    score_body,
)
from ..serving import scoring
from ._generate import parts, request_body
from ._lifetime import current_record
from ._routes import routes

P = TypeVar("P", PreparedRerank, PreparedScore)


@routes.post("/v1/rerank")
@routes.post("/rerank")
async def create_rerank() -> Response:
    return await _score(prepare_rerank, rerank_body)


@routes.post("/v1/score")
@routes.post("/score")
async def create_score() -> Response:
    return await _score(prepare_score, score_body)


async def _score(
    prepare: Callable[[Any, ServedEmbedder], P], body: Callable[[P, list[np.ndarray]], bytes]
) -> Response:
    serving = parts()
    service, preparation = serving.service, serving.preparation
    models = service.check_open()
    deadline = preparation.deadline()
    raw = await request_body()
    parsed: Any = None
    if models.only is None:  # a server of several: the body says which model
        parsed = await preparation.prepare(lambda: parse_json(raw), deadline)
    slot = service.slot_for(parsed).expect("scoring")
    record = current_record()
    async with models.lease(slot, deadline) as leased:
        hosted = scoring(leased)

        def prepared_body() -> P:
            return prepare(parse_json(raw) if parsed is None else parsed, hosted.served)

        prepared = await preparation.prepare(prepared_body, deadline)
        request = prepared.scoring.request
        if record is not None:
            record.model = hosted.served.name
            record.prompt_tokens = request.tokens
        rows = await hosted.jobs.run(request, deadline, record)
    data = await preparation.prepare(lambda: body(prepared, rows), deadline)
    return Response(data, content_type="application/json")
