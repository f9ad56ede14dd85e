"""One sequence seen from Trio: its handle (events, confirmation) and the stream callers read.

Cancellation: iterating a `TokenStream` waits for the sequence's next event and can be
cancelled at no cost (the sequence goes on until its owner, `Engine.generate`, leaves).
"""

from __future__ import annotations

from typing import Protocol

import attrs
import trio

from .. import fault_points
from ._messages import StepEvent
from ._types import GenerationRequest, TokenEvent
from ._upstream import StreamingDetokenizer

CONSUMER_STALLED = "the consumer fell behind"
"""A stream's last event's `error` when its consumer stopped reading and the engine cancelled
it (`max_buffered_events`): the consumer's doing, not the engine's."""


class StreamControl(Protocol):
    """What a stream may ask of its engine."""

    def cancel(self, handle: Handle) -> None: ...

    def confirmation_seen(self) -> None: ...


@attrs.define(eq=False)
class Handle:
    """The Trio side of one sequence: its event buffer and its confirmation."""

    seq_id: int
    request: GenerationRequest
    send: trio.MemorySendChannel[StepEvent]
    receive: trio.MemoryReceiveChannel[StepEvent]
    detokenizer: StreamingDetokenizer
    """The sequence's streaming detokenizer. It runs in the consumer's task: not on the engine
    thread, which a lone stream of a large model is bound by, and not in `_deliver`, which
    every confirmation waits for."""
    confirmed: trio.Event = attrs.Factory(trio.Event)
    stalled: bool = False
    cancel_requested_step: int | None = None
    cancel_requested_at: float | None = None
    confirmed_step: int | None = None

    def token_event(self, step: StepEvent) -> TokenEvent:
        """Detokenize a step's event. A stop token's text is never shown but releases
        what was held back, as the end of the budget does; a cancel or error does not."""
        detokenizer = self.detokenizer
        if step.token_id is not None:
            fault_points.reach("detokenize")
            detokenizer.add_token(step.token_id)
        if step.finish_reason in ("stop", "length"):
            detokenizer.finalize()
        return TokenEvent(
            step.token_id,
            detokenizer.last_segment,
            step.logprob,
            step.finish_reason,
            step.usage,
            step.error,
        )


class TokenStream:
    """Async iterator over one sequence's events; it always ends with a final event."""

    def __init__(self, handle: Handle, control: StreamControl) -> None:
        self._handle = handle
        self._control = control
        self._done = False

    def stop(self) -> None:
        """Ask the engine to end the sequence before its next step; keep iterating for its
        final event (finish reason "cancelled", with usage). For callers that decide to stop
        on their own terms (a stop string) but still want the accounting. Does not block."""
        self._control.cancel(self._handle)

    def __aiter__(self) -> TokenStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            step = await self._handle.receive.receive()
        except trio.EndOfChannel:
            self._done = True
            reason = CONSUMER_STALLED if self._handle.stalled else "the engine stopped"
            return TokenEvent(None, "", finish_reason="error", error=reason)
        self._done = step.is_final
        if step.is_final:
            self._control.confirmation_seen()  # it came with the confirmation
        return self._handle.token_event(step)

    @property
    def steps_in_flight_at_cancel(self) -> int | None:
        """After a cancellation: engine steps completed between the request and the confirmation."""
        handle = self._handle
        if handle.cancel_requested_step is None or handle.confirmed_step is None:
            return None
        return handle.confirmed_step - handle.cancel_requested_step
