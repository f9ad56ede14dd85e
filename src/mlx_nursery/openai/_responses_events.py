"""The Responses stream's events (attrs), one class per `type`, fields in the order the
spec lists them, `sequence_number` last. `ResponseBuilder` numbers and emits them."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ._responses_objects import OutputItem, OutputLogprob, OutputText, ReasoningText, Response


# -- the response as a whole ------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class ResponseCreated:
    type: Literal["response.created"] = "response.created"
    response: Response
    sequence_number: int


@attrs.frozen(kw_only=True)
class ResponseQueued:
    """A background response waits for a lane (after `response.created`)."""

    type: Literal["response.queued"] = "response.queued"
    response: Response
    sequence_number: int


@attrs.frozen(kw_only=True)
class ResponseInProgress:
    type: Literal["response.in_progress"] = "response.in_progress"
    response: Response
    sequence_number: int


@attrs.frozen(kw_only=True)
class ResponseCompleted:
    type: Literal["response.completed"] = "response.completed"
    response: Response
    sequence_number: int


@attrs.frozen(kw_only=True)
class ResponseIncomplete:
    type: Literal["response.incomplete"] = "response.incomplete"
    response: Response
    sequence_number: int


@attrs.frozen(kw_only=True)
class ResponseFailed:
    """A background response's end without a result: failed, or cancelled (its response's
    status says which)."""

    type: Literal["response.failed"] = "response.failed"
    response: Response
    sequence_number: int


@attrs.frozen(kw_only=True)
class ErrorEvent:
    """A failure after the stream began: the last event (the response is then `failed`)."""

    type: Literal["error"] = "error"
    code: str
    message: str
    param: str | None
    sequence_number: int


# -- output items -----------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class OutputItemAdded:
    type: Literal["response.output_item.added"] = "response.output_item.added"
    output_index: int
    item: OutputItem
    sequence_number: int


@attrs.frozen(kw_only=True)
class OutputItemDone:
    type: Literal["response.output_item.done"] = "response.output_item.done"
    output_index: int
    item: OutputItem
    sequence_number: int


# -- a message's text -------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class ContentPartAdded:
    type: Literal["response.content_part.added"] = "response.content_part.added"
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText
    sequence_number: int


@attrs.frozen(kw_only=True)
class ContentPartDone:
    type: Literal["response.content_part.done"] = "response.content_part.done"
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText
    sequence_number: int


@attrs.frozen(kw_only=True)
class OutputTextDelta:
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[OutputLogprob]
    sequence_number: int


@attrs.frozen(kw_only=True)
class OutputTextDone:
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[OutputLogprob]
    sequence_number: int


# -- a reasoning item's text ------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class ReasoningTextDelta:
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    sequence_number: int


@attrs.frozen(kw_only=True)
class ReasoningTextDone:
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    sequence_number: int


# -- a function call's arguments --------------------------------------------------------------
@attrs.frozen(kw_only=True)
class FunctionCallArgumentsDelta:
    type: Literal["response.function_call_arguments.delta"] = (
        "response.function_call_arguments.delta"
    )
    item_id: str
    output_index: int
    delta: str
    sequence_number: int


@attrs.frozen(kw_only=True)
class FunctionCallArgumentsDone:
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str
    sequence_number: int


StreamEvent = (
    ResponseCreated
    | ResponseQueued
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | ErrorEvent
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
)


def failed_event(response: dict[str, Any], sequence_number: int) -> dict[str, Any]:
    """`response.failed` for a response already JSON (a stored body), as `ResponseFailed`
    unstructures: a stream settled after its process was gone ends with it."""
    return {"type": "response.failed", "response": response, "sequence_number": sequence_number}
