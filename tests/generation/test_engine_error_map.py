"""The one map from engine errors to API errors, and the checks every API shares: each
engine error reads the same on every endpoint (status, code, the prompt's parameter), and
ranges and timeouts are worded once."""

from __future__ import annotations

import pytest

from mlx_nursery.engine import (
    EmbeddingFailed,
    EngineOverloaded,
    EngineUnavailable,
    PromptTooLong,
)
from mlx_nursery.generation import (
    InvalidRequest,
    OpenAIError,
    Overloaded,
    api_error,
    check_between,
    engine_errors_as_api_errors,
    request_timed_out,
)


@pytest.mark.parametrize(
    "error, status, code, retry_after",
    [
        (EngineOverloaded(7, 8), 503, "server_overloaded", 1),
        (EngineUnavailable("engine detail"), 503, "server_unavailable", 1),
        (EmbeddingFailed("engine detail"), 500, "embedding_failed", None),
        (PromptTooLong(90, 20, 100), 400, "context_length_exceeded", None),
    ],
)
def test_each_engine_error_has_one_api_error(
    error: Exception, status: int, code: str, retry_after: float | None
) -> None:
    mapped = api_error(error, "prompt")  # type: ignore[arg-type]
    assert (mapped.status, mapped.code, mapped.retry_after) == (status, code, retry_after)
    assert "engine detail" not in mapped.message  # engine details are logged, not returned


def test_a_prompt_too_long_names_the_apis_prompt_and_the_numbers() -> None:
    mapped = api_error(PromptTooLong(90, 20, 100), "input")
    assert mapped.param == "input"
    assert "maximum context length is 100 tokens" in mapped.message
    assert "110 tokens (90 in the prompt, 20 for the completion)" in mapped.message


def test_the_block_raises_the_api_error_and_lets_others_through() -> None:
    with (
        pytest.raises(Overloaded, match="7 requests waiting") as caught,
        engine_errors_as_api_errors(),
    ):
        raise EngineOverloaded(7, 8)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(KeyError), engine_errors_as_api_errors():
        raise KeyError("not an engine error")


@pytest.mark.parametrize(
    "value, low, high, message",
    [
        (2.5, 0.0, 2.0, "temperature must be between 0 and 2"),
        (1.5, 0.0, 1.0, "temperature must be between 0 and 1"),
        (float("nan"), 0.0, 2.0, "temperature must be between 0 and 2"),
        (-2.5, -2.0, 2.0, "temperature must be between -2 and 2"),
    ],
)
def test_a_value_out_of_range_is_a_400_naming_it(
    value: float, low: float, high: float, message: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_between(value, low, high, "temperature")
    assert (caught.value.message, caught.value.param, caught.value.code) == (
        message,
        "temperature",
        "invalid_value",
    )


def test_in_range_and_absent_values_pass() -> None:
    for value in (None, 0.0, 1.0, 2.0):
        check_between(value, 0.0, 2.0, "temperature")


def test_the_timeout_is_a_504_worded_once() -> None:
    error: OpenAIError = request_timed_out(2.5)
    assert (error.status, error.code) == (504, "request_timeout")
    assert error.message == "the request did not complete within 2.5 s"
