"""The Responses API's output: `ResponseBuilder` grows the output items and makes the
stream's events in the order the SDK checks.

The objects are attrs classes (`_responses_objects`, `_responses_events`); each event and
each snapshot of the response is unstructured when it is made, so later growth of an open
item never changes what was already sent.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from ..engine import Usage
from ..generation import (
    Finished,
    LogprobEntry,
    OpenAIError,
    TextFormat,
    ToolCallOut,
    strict_tool_names,
    to_json,
)
from ._responses import PreparedResponse
from ._responses_events import (
    ContentPartAdded,
    ContentPartDone,
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCompleted,
    ResponseCreated,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseQueued,
    StreamEvent,
)
from ._responses_items import item_id
from ._responses_objects import (
    FlatFunctionTool,
    IncompleteDetails,
    OutputFunctionCall,
    OutputItem,
    OutputLogprob,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningConfig,
    ReasoningText,
    Response,
    ResponseError,
    ResponseStatus,
    ResponseText,
    ResponseUsage,
)


class ResponseBuilder:
    """Builds the output items and, for streams, the events in the order the SDK checks.

    Every method returns its events as JSON-ready dicts, numbered in the order made."""

    def __init__(self, prepared: PreparedResponse) -> None:
        self._p = prepared
        self._seq = 0
        self.output: list[OutputItem] = []
        self._message: OutputMessage | None = None
        self._reasoning: OutputReasoning | None = None
        self.usage: Usage | None = None
        self.reasoning_tokens = 0
        self.status: ResponseStatus = "in_progress"
        self.completed_at: int | None = None
        self.incomplete_reason: Literal["max_output_tokens"] | None = None
        self.error: ResponseError | None = None

    # events ------------------------------------------------------------------------------
    def _next(self) -> int:
        self._seq += 1
        return self._seq - 1

    def opening(self) -> list[dict[str, Any]]:
        snapshot = self._response()
        return [
            _json(ResponseCreated(response=snapshot, sequence_number=self._next())),
            _json(ResponseInProgress(response=snapshot, sequence_number=self._next())),
        ]

    def queued(self) -> list[dict[str, Any]]:
        """A background response's first events, and its status until it holds a lane."""
        self.status = "queued"
        snapshot = self._response()
        return [
            _json(ResponseCreated(response=snapshot, sequence_number=self._next())),
            _json(ResponseQueued(response=snapshot, sequence_number=self._next())),
        ]

    def started(self) -> list[dict[str, Any]]:
        """A queued background response holds a lane: in progress."""
        self.status = "in_progress"
        return [_json(ResponseInProgress(response=self._response(), sequence_number=self._next()))]

    def stopped(self, error: OpenAIError | None) -> dict[str, Any]:
        """A background response ended without a result: cancelled (`error` None), or failed
        with `error`. Its last event is `response.failed`, whose response says which (the
        Responses stream has no event of its own for a cancel). Open items stay as they were
        (in progress), as OpenAI's cancelled responses show them."""
        if error is None:
            self.status = "cancelled"
        else:
            self.status = "failed"
            self.error = ResponseError("server_error", error.message)
        return _json(ResponseFailed(response=self._response(), sequence_number=self._next()))

    def reasoning(self, delta: str) -> list[dict[str, Any]]:
        """A piece of a thinking model's reasoning: a `reasoning` item with one
        `reasoning_text` part, opened on the first piece."""
        events = []
        item = self._reasoning
        if item is None:
            item = self._reasoning = OutputReasoning(id=item_id("rs"))
            self.output.append(item)
            index = len(self.output) - 1
            events.append(
                _json(OutputItemAdded(output_index=index, item=item, sequence_number=self._next()))
            )
            part = ReasoningText()
            item.content.append(part)
            events.append(
                _json(
                    ContentPartAdded(
                        item_id=item.id,
                        output_index=index,
                        content_index=0,
                        part=part,
                        sequence_number=self._next(),
                    )
                )
            )
        item.content[0].text += delta
        events.append(
            _json(
                ReasoningTextDelta(
                    item_id=item.id,
                    output_index=self.output.index(item),
                    content_index=0,
                    delta=delta,
                    sequence_number=self._next(),
                )
            )
        )
        return events

    def text(self, delta: str, logprobs: tuple[LogprobEntry, ...] = ()) -> list[dict[str, Any]]:
        events = self._close_reasoning()
        message = self._message
        if message is None:
            message = self._message = OutputMessage(id=item_id("msg"))
            self.output.append(message)
            index = len(self.output) - 1
            events.append(
                _json(
                    OutputItemAdded(output_index=index, item=message, sequence_number=self._next())
                )
            )
            part = OutputText()
            message.content.append(part)
            events.append(
                _json(
                    ContentPartAdded(
                        item_id=message.id,
                        output_index=index,
                        content_index=0,
                        part=part,
                        sequence_number=self._next(),
                    )
                )
            )
        entries = [OutputLogprob.of(e) for e in logprobs]
        part = message.content[0]
        part.text += delta
        part.logprobs += entries
        events.append(
            _json(
                OutputTextDelta(
                    item_id=message.id,
                    output_index=len(self.output) - 1,
                    content_index=0,
                    delta=delta,
                    logprobs=entries,
                    sequence_number=self._next(),
                )
            )
        )
        return events

    def call(self, call: ToolCallOut) -> list[dict[str, Any]]:
        events = self._close_reasoning() + self._close_message()
        item = OutputFunctionCall(id=item_id("fc"), call_id=call.id, name=call.name)
        self.output.append(item)
        index = len(self.output) - 1
        events.append(
            _json(OutputItemAdded(output_index=index, item=item, sequence_number=self._next()))
        )
        events.append(
            _json(
                FunctionCallArgumentsDelta(
                    item_id=item.id,
                    output_index=index,
                    delta=call.arguments,
                    sequence_number=self._next(),
                )
            )
        )
        item.arguments = call.arguments
        events.append(
            _json(
                FunctionCallArgumentsDone(
                    item_id=item.id,
                    output_index=index,
                    name=call.name,
                    arguments=call.arguments,
                    sequence_number=self._next(),
                )
            )
        )
        item.status = "completed" if call.complete else "incomplete"
        events.append(
            _json(OutputItemDone(output_index=index, item=item, sequence_number=self._next()))
        )
        return events

    def finish(self, finished: Finished) -> list[dict[str, Any]]:
        """Close the open item and settle the status; the final event comes from `final_event`.
        A message cut off by the token budget is `incomplete`, as its response is."""
        cut = finished.reason == "length"
        status: Literal["completed", "incomplete"] = "incomplete" if cut else "completed"
        events = self._close_reasoning(status) + self._close_message(status)
        self.usage = finished.usage
        self.reasoning_tokens = finished.reasoning_tokens
        if cut:
            self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
        else:
            self.status = "completed"
            self.completed_at = int(time.time())
        return events

    def final_event(self) -> dict[str, Any]:
        snapshot, number = self._response(), self._next()
        if self.status == "completed":
            return _json(ResponseCompleted(response=snapshot, sequence_number=number))
        return _json(ResponseIncomplete(response=snapshot, sequence_number=number))

    def error_event(self, error: OpenAIError) -> dict[str, Any]:
        self.status = "failed"
        return _json(
            ErrorEvent(
                code=error.code or error.type,
                message=error.message,
                param=error.param,
                sequence_number=self._next(),
            )
        )

    def _close_reasoning(
        self, status: Literal["completed", "incomplete"] = "completed"
    ) -> list[dict[str, Any]]:
        item, self._reasoning = self._reasoning, None
        if item is None:
            return []
        index = self.output.index(item)
        part = item.content[0]
        item.status = status
        done = ReasoningTextDone(
            item_id=item.id,
            output_index=index,
            content_index=0,
            text=part.text,
            sequence_number=self._next(),
        )
        return [_json(done), *self._part_and_item_done(item, index, part)]

    def _close_message(
        self, status: Literal["completed", "incomplete"] = "completed"
    ) -> list[dict[str, Any]]:
        message, self._message = self._message, None
        if message is None:
            return []
        index = self.output.index(message)
        part = message.content[0]
        message.status = status
        done = OutputTextDone(
            item_id=message.id,
            output_index=index,
            content_index=0,
            text=part.text,
            logprobs=part.logprobs,
            sequence_number=self._next(),
        )
        return [_json(done), *self._part_and_item_done(message, index, part)]

    def _part_and_item_done(
        self, item: OutputReasoning | OutputMessage, index: int, part: OutputText | ReasoningText
    ) -> list[dict[str, Any]]:
        """What closes an output item of one content part, after its text's done event."""
        part_done = ContentPartDone(
            item_id=item.id,
            output_index=index,
            content_index=0,
            part=part,
            sequence_number=self._next(),
        )
        item_done = OutputItemDone(output_index=index, item=item, sequence_number=self._next())
        return [_json(part_done), _json(item_done)]

    # the response object -----------------------------------------------------------------
    def response(self) -> dict[str, Any]:
        """The response as it stands, JSON-ready (the body, and what the store keeps)."""
        body: dict[str, Any] = to_json(self._response())
        return body

    def _response(self) -> Response:
        p, r = self._p, self._p.request
        strict = strict_tool_names(r.tools)
        return Response(
            id=p.id,
            created_at=p.created_at,
            status=self.status,
            completed_at=self.completed_at,
            background=p.background,
            error=self.error,
            incomplete_details=IncompleteDetails(self.incomplete_reason)
            if self.incomplete_reason
            else None,
            instructions=r.instructions,
            max_output_tokens=r.max_output_tokens,
            model=r.model,
            output=list(self.output),
            parallel_tool_calls=r.parallel_tool_calls is not False,
            previous_response_id=r.previous_response_id,
            store=p.store,
            temperature=1.0 if r.temperature is None else r.temperature,
            text=ResponseText(r.text.format if r.text and r.text.format else TextFormat()),
            tool_choice="auto" if r.tool_choice is None else r.tool_choice,
            tools=[FlatFunctionTool.of(t["function"], strict) for t in p.prepared.tools],
            top_p=1.0 if r.top_p is None else r.top_p,
            top_logprobs=r.top_logprobs,
            truncation=r.truncation or "disabled",
            max_tool_calls=r.max_tool_calls,
            metadata=r.metadata or {},
            user=r.user,
            safety_identifier=r.safety_identifier,
            prompt_cache_key=r.prompt_cache_key,
            usage=None
            if self.usage is None
            else ResponseUsage.of(self.usage, self.reasoning_tokens),
            reasoning=ReasoningConfig(effort=p.reasoning_effort),
            service_tier=p.prepared.service_tier,
        )

    def conversation(self) -> list[dict[str, Any]]:
        """The conversation a follow-up replays: this turn's input plus its output."""
        text = "".join(
            item.content[0].text for item in self.output if isinstance(item, OutputMessage)
        )
        calls = [
            {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            for item in self.output
            if isinstance(item, OutputFunctionCall)
        ]
        reply: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            reply["tool_calls"] = calls
        reasoning = "".join(
            item.content[0].text for item in self.output if isinstance(item, OutputReasoning)
        )
        if reasoning:  # a thinking template renders it back where its model wants it
            reply["reasoning_content"] = reasoning
        return [*self._p.conversation, reply]


def _json(event: StreamEvent) -> dict[str, Any]:
    """An event as JSON-ready data, unstructured now: the items it holds grow later."""
    data: dict[str, Any] = to_json(event)
    return data
