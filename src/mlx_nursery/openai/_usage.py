"""Usage as chat and completions report it, and the ids and timestamps of their objects."""

from __future__ import annotations

import attrs

from ..engine import Usage


@attrs.frozen
class PromptTokensDetails:
    cached_tokens: int


@attrs.frozen
class CompletionTokensDetails:
    reasoning_tokens: int


@attrs.frozen
class UsageOut:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails

    @classmethod
    def of(cls, usage: Usage, reasoning_tokens: int = 0) -> UsageOut:
        """`reasoning_tokens`: of the completion's tokens, those a thinking model thought."""
        return cls(
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.total_tokens,
            PromptTokensDetails(usage.cached_tokens),
            CompletionTokensDetails(reasoning_tokens),
        )
