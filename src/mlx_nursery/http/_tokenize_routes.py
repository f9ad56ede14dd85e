"""/tokenize and /detokenize (vLLM's routes and shapes), also under /v1: a client configured
with a `.../v1` base URL (the OpenAI SDKs') reaches them there. Keys as on every API route
(`_access.py`). The model is leased as a generation would lease it (an embedding or speech
model is a 400 before anything loads), the work runs on a preparation thread, nothing runs
on the engine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from quart import Response, g

from ..generation import ImageRef, ServedModel, chat_images
from ..openai import Tokenized, prepare_detokenize, prepare_tokenize
from ..serving import Recipe
from ._generate import IGNORED_HEADER, as_json, parts, request_body
from ._routes import routes

T = TypeVar("T")


class _Tokenize(Recipe[Tokenized]):
    lazy = True  # the body is the request, as chat's: its images are named in the raw body
    names_images = True

    def images(self, request: Any) -> Iterable[ImageRef]:
        return chat_images(request)

    def prepare(self, request: Any, served: ServedModel) -> Tokenized:
        return prepare_tokenize(request, served)


class _Detokenize(Recipe[dict[str, Any]]):
    lazy = True

    def prepare(self, request: Any, served: ServedModel) -> dict[str, Any]:
        return prepare_detokenize(request, served)


@routes.post("/tokenize")
@routes.post("/v1/tokenize")
async def tokenize() -> Response:
    """A prompt's token ids as the model will see them (`count`, `tokens`, `max_model_len`,
    `token_strs`); nothing is generated. Cancelled with the request (its client leaving):
    an abandoned preparation thread stops at its next check."""
    tokenized = await _prepared(_Tokenize())
    if tokenized.ignored:
        g.response_headers = {IGNORED_HEADER: ", ".join(tokenized.ignored)}
    return as_json(tokenized.body)


@routes.post("/detokenize")
@routes.post("/v1/detokenize")
async def detokenize() -> Response:
    """Token ids back to text (`prompt`). Cancelled as /tokenize."""
    return as_json(await _prepared(_Detokenize()))


async def _prepared(recipe: Recipe[T]) -> T:
    serving = parts()
    serving.service.check_open()  # the 503 before the body is read
    deadline = serving.preparation.deadline()
    raw = await request_body()
    return await serving.generations.prepare(recipe, raw, deadline)
