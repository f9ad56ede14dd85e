"""The text APIs' renderers (serving/_rendering.py): chat and completions chunks, the
Messages API's named events, the Responses API's named events, and their whole bodies."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from ..anthropic import MessageContent, MessageEvents, message_body
from ..anthropic import error_body as anthropic_error
from ..generation import (
    Admitted,
    Finished,
    LogprobEntry,
    OpenAIError,
    Prepared,
    ReasoningDelta,
    RequestCancelled,
    TextDelta,
    ToolCallOut,
)
from ..openai import PreparedResponse, ResponseBuilder
from ..store import ResponsesStorage, StoredResponse
from ._sse import DONE, data_event, json_event, named_events


@attrs.define
class ChunkStream:
    """Chat and completions chunks (`data:` events, then `[DONE]`)."""

    prepared: Prepared
    offset: int = 0
    """Characters of content sent so far (completions' `text_offset`)."""

    def opening(self) -> bytes:
        return b"".join(data_event(chunk) for chunk in self.prepared.opening_chunks())

    def admitted(self, item: Admitted) -> bytes:
        return b""

    def text(self, item: TextDelta) -> bytes:
        start, self.offset = self.offset, self.offset + len(item.text)
        if self.prepared.token_text is None:
            return json_event(self.prepared.delta_json(item.text))
        return data_event(self.prepared.delta_chunk(item.text, item.logprobs, start))

    def reasoning(self, item: ReasoningDelta) -> bytes:
        return data_event(self.prepared.reasoning_chunk(item.text))

    def call(self, item: ToolCallOut) -> bytes:
        return b"".join(data_event(chunk) for chunk in self.prepared.tool_call_chunks(item))

    async def finish(self, item: Finished) -> bytes:
        closing = b"".join(data_event(chunk) for chunk in self.prepared.closing_chunks(item))
        return closing + DONE

    async def error(self, error: OpenAIError) -> bytes:
        return data_event(error.envelope())


Body = Callable[
    [Prepared, str, Finished, list[ToolCallOut], list[LogprobEntry], str | None], dict[str, Any]
]
"""An API's non-streaming body from a job's whole output: its text, its end, its tool calls,
its logprobs and its reasoning (None: the model did not think). Chat's and completions'
(Messages' keeps its blocks in order: `WholeMessage`)."""


def wire_body(
    prepared: Prepared,
    text: str,
    finished: Finished,
    calls: list[ToolCallOut],
    logprobs: list[LogprobEntry],
    reasoning: str | None,
) -> dict[str, Any]:
    """Chat's and completions' body, as the request's preparation renders it."""
    return prepared.body(text, finished, calls, logprobs, reasoning)


@attrs.define
class WholeBody:
    """A whole body gathered from the pieces: chat's or completions'."""

    prepared: Prepared
    body: Body = wire_body
    pieces: list[str] = attrs.Factory(list)
    thoughts: list[str] = attrs.Factory(list)
    calls: list[ToolCallOut] = attrs.Factory(list)
    logprobs: list[LogprobEntry] = attrs.Factory(list)

    def admitted(self, item: Admitted) -> None:
        pass

    def text(self, item: TextDelta) -> None:
        self.pieces.append(item.text)
        self.logprobs.extend(item.logprobs)

    def reasoning(self, item: ReasoningDelta) -> None:
        self.thoughts.append(item.text)

    def call(self, item: ToolCallOut) -> None:
        self.calls.append(item)

    async def finish(self, item: Finished) -> dict[str, Any]:
        reasoning = "".join(self.thoughts) or None  # only a thinking model's message has one
        text = "".join(self.pieces)
        return self.body(self.prepared, text, item, self.calls, self.logprobs, reasoning)


@attrs.define
class WholeMessage:
    """A Messages API body gathered from the pieces: its blocks folded from the events its
    stream would send, so that the two read the same (`MessageContent`)."""

    prepared: Prepared
    content: MessageContent

    def admitted(self, item: Admitted) -> None:
        pass

    def text(self, item: TextDelta) -> None:
        self.content.text(item)

    def reasoning(self, item: ReasoningDelta) -> None:
        self.content.thinking(item)

    def call(self, item: ToolCallOut) -> None:
        self.content.call(item)

    async def finish(self, item: Finished) -> dict[str, Any]:
        return message_body(self.prepared, self.content.blocks, item)


@attrs.define
class MessageStream:
    """A message's named SSE events."""

    events: MessageEvents
    request_id: str
    """Read in the handler: the body runs outside the request's context."""

    def opening(self) -> bytes:
        return b""  # message_start waits for the admission, which says the prompt's usage

    def admitted(self, item: Admitted) -> bytes:
        return named_events(self.events.opening(item))

    def text(self, item: TextDelta) -> bytes:
        return named_events(self.events.text(item))

    def reasoning(self, item: ReasoningDelta) -> bytes:
        return named_events(self.events.thinking(item))

    def call(self, item: ToolCallOut) -> bytes:
        return named_events(self.events.call(item))

    async def finish(self, item: Finished) -> bytes:
        return named_events(self.events.finish(item))

    async def error(self, error: OpenAIError) -> bytes:
        return named_events([anthropic_error(error, self.request_id)])


@attrs.define
class ResponseSaver:
    """Stores a finished response (when asked to) for the tenant that will own it."""

    store: ResponsesStorage
    prepared: PreparedResponse
    owner: str | None

    async def save(self, builder: ResponseBuilder) -> None:
        if self.prepared.store:
            await self.store.put(
                StoredResponse(
                    self.prepared.id,
                    time.time(),  # the store's order: created_at has whole seconds
                    builder.response(),
                    self.prepared.input_items,
                    builder.conversation(),
                    self.owner,
                )
            )


@attrs.define
class ResponseStream:
    """The named SSE events of one response. The response is stored before its final event
    goes out, so a client can always retrieve what it was told is done."""

    builder: ResponseBuilder
    saver: ResponseSaver

    def opening(self) -> bytes:
        return named_events(self.builder.opening())

    def admitted(self, item: Admitted) -> bytes:
        return b""

    def text(self, item: TextDelta) -> bytes:
        return named_events(self.builder.text(item.text, item.logprobs))

    def reasoning(self, item: ReasoningDelta) -> bytes:
        return named_events(self.builder.reasoning(item.text))

    def call(self, item: ToolCallOut) -> bytes:
        return named_events(self.builder.call(item))

    async def finish(self, item: Finished) -> bytes:
        events = self.builder.finish(item)
        await self.saver.save(self.builder)
        return named_events([*events, self.builder.final_event()])

    async def error(self, error: OpenAIError) -> bytes:
        """The error event, then `response.failed` with the failed response (cancelled, when
        a cancel by its id ended it), stored first (when asked to), as a finished one is."""
        ended = None if isinstance(error, RequestCancelled) else error
        events = [self.builder.error_event(error), self.builder.stopped(ended)]
        await self.saver.save(self.builder)
        return named_events(events)


@attrs.define
class ResponseBody:
    """A whole response, stored (when asked to) before it is answered."""

    builder: ResponseBuilder
    saver: ResponseSaver

    def admitted(self, item: Admitted) -> None:
        pass

    def text(self, item: TextDelta) -> None:
        self.builder.text(item.text, item.logprobs)

    def reasoning(self, item: ReasoningDelta) -> None:
        self.builder.reasoning(item.text)

    def call(self, item: ToolCallOut) -> None:
        self.builder.call(item)

    async def finish(self, item: Finished) -> dict[str, Any]:
        self.builder.finish(item)
        await self.saver.save(self.builder)
        response: dict[str, Any] = self.builder.response()
        return response
