"""/v1/completions: the request we accept and the objects we send back."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ..generation import SamplingFields
from ._usage import UsageOut


@attrs.define(kw_only=True)
class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None


@attrs.frozen
class CompletionChoice:
    index: int
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


@attrs.frozen
class Completion:
    """Both the body and the stream chunks of /v1/completions (OpenAI uses one shape)."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageOut | None = None
    object: Literal["text_completion"] = "text_completion"
