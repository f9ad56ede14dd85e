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
    accepted_prediction_tokens: int = 0
    """Tokens drafted by speculative decoding (`--speculative`) that the completion kept.
    OpenAI reports a Predicted Output's tokens here; ours are the server's own drafts."""
    rejected_prediction_tokens: int = 0
    """Drafted tokens that were computed and dropped. Unlike OpenAI's, they are not counted
    in `completion_tokens`: the completion's tokens are those generated."""


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
            CompletionTokensDetails(
                reasoning_tokens,
                usage.accepted_draft_tokens,
                usage.draft_tokens - usage.accepted_draft_tokens,
            ),
        )
