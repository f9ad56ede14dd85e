"""The Responses API's objects: the response, its output items and usage (attrs), in the
spec's field order; the stream's events are in `_responses_events`.

Output items are mutable: `ResponseBuilder` grows the open one as text arrives, and every
event or snapshot is unstructured (a fresh copy) when it is made. What the wire leaves out
(`top_logprobs`, `user` and `usage` when unset; null fields of an echoed text format) is
registered in `_converter`.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ..engine import Usage
from ..generation import (
    LogprobEntry,
    NamedToolChoice,
    TextFormatParam,
    ToolChoiceMode,
    ToolChoiceType,
)

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


# -- output items -----------------------------------------------------------------------------
@attrs.frozen
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int]


@attrs.frozen
class OutputLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]

    @classmethod
    def of(cls, entry: LogprobEntry) -> OutputLogprob:
        top = [TopLogprob(t, lp, list(b)) for t, lp, b in entry.top]
        return cls(entry.token, entry.logprob, list(entry.bytes), top)


@attrs.define
class OutputText:
    """A message's text part; its `text` and `logprobs` grow as the stream goes."""

    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[dict[str, Any]] = attrs.field(factory=list)
    """Always empty: nothing here cites files or URLs."""
    logprobs: list[OutputLogprob] = attrs.field(factory=list)


@attrs.define(kw_only=True)
class OutputMessage:
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus = "in_progress"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = attrs.field(factory=list)


@attrs.define(kw_only=True)
class OutputFunctionCall:
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = ""
    status: ItemStatus = "in_progress"


@attrs.define
class ReasoningText:
    """A reasoning item's text part; its `text` grows as the stream goes."""

    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


@attrs.define(kw_only=True)
class OutputReasoning:
    """A thinking model's reasoning: its think block's text (no summary is made)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[dict[str, Any]] = attrs.field(factory=list)
    content: list[ReasoningText] = attrs.field(factory=list)
    status: ItemStatus = "in_progress"


OutputItem = OutputReasoning | OutputMessage | OutputFunctionCall


# -- the response -----------------------------------------------------------------------------
@attrs.frozen
class InputTokensDetails:
    cached_tokens: int
    cache_write_tokens: int


@attrs.frozen
class OutputTokensDetails:
    reasoning_tokens: int = 0


@attrs.frozen
class ResponseUsage:
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage, reasoning_tokens: int = 0) -> ResponseUsage:
        cached = usage.cached_tokens
        return cls(
            usage.prompt_tokens,
            InputTokensDetails(cached, usage.prompt_tokens - cached),
            usage.completion_tokens,
            OutputTokensDetails(reasoning_tokens),
            usage.total_tokens,
        )


@attrs.frozen
class ResponseError:
    """Why a response failed. `code` is one of the spec's (`server_error` for everything this
    server fails a response for: a deadline, a shutdown, a restart, the engine)."""

    code: str
    message: str


@attrs.frozen
class IncompleteDetails:
    reason: Literal["max_output_tokens"]


@attrs.frozen
class ReasoningConfig:
    """The effort a thinking model acted on (turning its thinking on or off); unset for
    other models. No summary is ever made."""

    effort: str | None = None
    summary: None = None


@attrs.frozen
class ResponseText:
    format: TextFormatParam


@attrs.frozen(kw_only=True)
class FlatFunctionTool:
    """A function tool as the Responses API spells it (chat's `function` object flattened)."""

    type: Literal["function"] = "function"
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool

    @classmethod
    def of(cls, function: dict[str, Any], strict: frozenset[str]) -> FlatFunctionTool:
        """Chat's `function` object flattened; strict where its name is in `strict`."""
        return cls(
            name=function["name"],
            description=function.get("description"),
            parameters=function.get("parameters"),
            strict=function["name"] in strict,
        )


@attrs.frozen(kw_only=True)
class Response:
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    completed_at: int | None = None
    """When it completed (null until then, and for any other end), as OpenAI's."""
    background: bool = False
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig = attrs.field(factory=ReasoningConfig)
    service_tier: str | None = None
    """The tier served at, when the request named one; left out otherwise."""
    store: bool
    temperature: float
    text: ResponseText
    tool_choice: ToolChoiceMode | NamedToolChoice | ToolChoiceType
    tools: list[FlatFunctionTool]
    top_p: float
    top_logprobs: int | None = None
    """Left out when unset, as are `user` and `usage` (the spec types them non-nullable)."""
    truncation: str
    max_tool_calls: int | None
    metadata: dict[str, str]
    user: str | None = None
    safety_identifier: str | None = None
    """Echoed when sent, as `prompt_cache_key` (else absent)."""
    prompt_cache_key: str | None = None
    usage: ResponseUsage | None = None


@attrs.frozen(kw_only=True)
class InputItemList:
    """One page of /input_items; the items are the stored resources (`_responses_items`)."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
