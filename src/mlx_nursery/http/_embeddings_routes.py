"""/v1/embeddings: check and read the body, prepare it on the worker thread (validation and
tokenizing), compute on the model's engine in the request's scope, write the JSON body on the
worker thread too (millions of floats take a while to write)."""

from __future__ import annotations

from typing import Any

from quart import Response

from ..generation import parse_json
from ..openai import PreparedEmbeddings, embeddings_body, prepare_embeddings
from ..serving import embedding
from ._generate import current_live, parts, request_body
from ._lifetime import current_record
from ._routes import routes


@routes.post("/v1/embeddings")
async def create_embeddings() -> Response:
    serving = parts()
    service, preparation = serving.service, serving.preparation
    models = service.check_open()
    deadline = preparation.deadline()
    live = current_live()
    raw = await request_body()
    with live.guard():  # a cancel by the request's id stops it, whatever it is doing
        parsed: Any = None
        if models.only is None:  # a server of several: the body says which model
            parsed = await preparation.prepare(lambda: parse_json(raw), deadline)
        slot = service.slot_for(parsed).expect("embedding")
        record = current_record()
        async with models.lease(slot, deadline) as leased:
            hosted = embedding(leased)

            def prepare() -> PreparedEmbeddings:
                body = parse_json(raw) if parsed is None else parsed
                return prepare_embeddings(body, hosted.served)

            prepared = await preparation.prepare(prepare, deadline)
            if record is not None:
                record.model = hosted.served.name
                record.prompt_tokens = prepared.request.tokens
            vectors = await hosted.jobs.run(prepared.request, deadline, record, live)
        data = await preparation.prepare(lambda: embeddings_body(prepared, vectors), deadline)
    return Response(data, content_type="application/json")
