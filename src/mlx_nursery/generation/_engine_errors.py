"""The one map from the engine's errors to the server's API errors, and the messages of the
errors every request may end with (its deadline passed, a client cancelled it).

Every caller of an engine (generation, embeddings, transcription) translates through here, so
one engine failure reads the same on every endpoint: at capacity is 503 with Retry-After, not
serving is 503, a prompt past the context is a 400 naming the request's prompt parameter, a
batch the embedding model failed on is a 500.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..engine import (
    EmbeddingFailed,
    EngineOverloaded,
    EngineUnavailable,
    PromptTooLong,
    UnknownAdapter,
)
from ._errors import (
    GenerationFailed,
    InvalidRequest,
    ModelNotFound,
    OpenAIError,
    Overloaded,
    RequestCancelled,
    RequestTimeout,
    Unavailable,
)

MappedEngineError = (
    PromptTooLong | EngineOverloaded | EngineUnavailable | EmbeddingFailed | UnknownAdapter
)
_MAPPED = (PromptTooLong, EngineOverloaded, EngineUnavailable, EmbeddingFailed, UnknownAdapter)


def api_error(exc: MappedEngineError, prompt_param: str = "messages") -> OpenAIError:
    """The API error an engine error means (`prompt_param`: what a prompt-too-long error
    names)."""
    if isinstance(exc, PromptTooLong):
        return context_length_error(exc, prompt_param)
    if isinstance(exc, EngineOverloaded):
        return Overloaded(
            f"the server is at capacity ({exc.queued} requests waiting); retry later",
            code="server_overloaded",
        )
    if isinstance(exc, UnknownAdapter):  # unloaded since the request was read
        return ModelNotFound(
            "The model's adapter is no longer served.", param="model", code="model_not_found"
        )
    if isinstance(exc, EngineUnavailable):
        return Unavailable(
            "the model is not serving now (its engine stopped: restarting, unloaded or shutting "
            "down); retry shortly",
            code="server_unavailable",
        )
    return GenerationFailed(
        "the model failed on this request's inputs; the server's log says why",
        code="embedding_failed",
    )


@contextmanager
def engine_errors_as_api_errors(prompt_param: str = "messages") -> Iterator[None]:
    """Re-raise an engine error from the block as its API error (`api_error`), the engine's
    own traceback dropped: the map is the whole story the client gets. Other errors pass
    through. Not a checkpoint."""
    try:
        yield
    except _MAPPED as exc:
        raise api_error(exc, prompt_param) from None


def context_length_error(exc: PromptTooLong, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"This model's maximum context length is {exc.context_length} tokens. However, you "
        f"requested {exc.prompt_tokens + exc.max_tokens} tokens ({exc.prompt_tokens} in the "
        f"prompt, {exc.max_tokens} for the completion). Please reduce the prompt or the "
        "completion length.",
        param=param,
        code="context_length_exceeded",
    )


def request_timed_out(timeout: float) -> RequestTimeout:
    """The error of a request whose deadline (`--request-timeout` seconds, queueing included)
    passed: every endpoint words it so."""
    return RequestTimeout(
        f"the request did not complete within {timeout:g} s", code="request_timeout"
    )


def request_cancelled(request_id: str) -> RequestCancelled:
    """The error of a request a client cancelled by its id: every endpoint words it so, and
    names the cancel, so that its own client can tell it from a failure."""
    return RequestCancelled(
        f"the request {request_id} was cancelled (POST /v1/requests/{request_id}/cancel)",
        code="request_cancelled",
    )
