"""Engine events to outputs: thinking split off, stop strings applied, tool calls extracted,
OpenAI finish reasons.

`generate_text` runs one sequence and sends `ReasoningDelta`s, `TextDelta`s and
`ToolCallOut`s, then one `Finished`, to a channel. A thinking model's reasoning comes first
and goes out as it is; stop strings, tool calls and logprobs concern the answer only. It
raises the OpenAI-layer error of a failed sequence. The caller owns the task and its deadline
(see `http._jobs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import attrs
import trio

from ..engine import (
    CONSUMER_STALLED,
    Engine,
    EngineOverloaded,
    EngineUnavailable,
    GenerationRequest,
    PromptTooLong,
    TokenEvent,
    Usage,
)
from ._engine_errors import api_error
from ._errors import ClientTooSlow, GenerationFailed, InvalidRequest, Unavailable, shortened
from ._logprobs import LogprobAligner, LogprobEntry
from ._reasoning import AnswerPiece, ReasoningPiece, ReasoningSplitter
from ._stop import StopMatcher
from ._tool_calls import ContentText, ToolCallExtractor, ToolCallOut

log = logging.getLogger("mlx_nursery.openai")

OpenAIFinish = Literal["stop", "length", "tool_calls"]


@attrs.frozen
class TextDelta:
    text: str
    logprobs: tuple[LogprobEntry, ...] = ()
    """Entries for the tokens this text completes (when logprobs were asked for)."""


@attrs.frozen
class ReasoningDelta:
    """A piece of a thinking model's reasoning (its think block, markers left out)."""

    text: str


@attrs.frozen
class Finished:
    reason: OpenAIFinish
    usage: Usage
    reasoning_tokens: int = attrs.field(default=0, kw_only=True)
    """Of `usage.completion_tokens`, those generated while thinking (the markers included)."""
    stop_sequence: str | None = attrs.field(default=None, kw_only=True)
    """The stop string that ended the text ("stop" only; the Messages API reports it)."""


@attrs.frozen
class Admitted:
    """The sequence is admitted: its prompt's usage (the prefix cache's read known), before
    any output. Sent first, only for a request with `report_admission` (a Messages stream's
    `message_start`); it is no output of the model's, so `observe` never sees it."""

    usage: Usage


Output = Admitted | ReasoningDelta | TextDelta | ToolCallOut | Finished


async def generate_text(
    engine: Engine,
    request: GenerationRequest,
    stops: tuple[str, ...],
    send: trio.MemorySendChannel[Output],
    *,
    prompt_param: str = "messages",
    tools: ToolCallExtractor | None = None,
    logprobs: LogprobAligner | None = None,
    reasoning: ReasoningSplitter | None = None,
    observe: Callable[[Output], None] | None = None,
    usage: Callable[[Usage], Usage] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Generate, reporting `started` once the sequence holds a lane (errors before that raise).
    `reasoning` splits a thinking model's reasoning from its answer. `observe` sees each
    output once it is sent (metrics). `usage` rewrites the usage reported (the scripted
    model's `script.usage`).

    Cancellation: cancelled while waiting for a lane, nothing was admitted and no compute
    ran. After that, `Cancelled` propagates only once the engine has confirmed that the
    sequence stopped (a shielded wait, bounded by the engine's `cancel_ack_timeout`): no
    more compute will be started for it and its lane is back, though a step already in
    flight may still land. Outputs sent before the cancel stay in `send`; an output whose
    `send` was cancelled was not sent; no `Finished` follows a cancel. `send` is left open:
    the caller owns it.
    """
    matcher = StopMatcher(stops)

    async def put(output: Output) -> None:
        await _put(send, output)
        if observe is not None:
            observe(output)

    async def emit(text: str) -> None:
        if tools is None:
            entries = tuple(logprobs.take(text)) if logprobs is not None else ()
            if text or entries:
                await put(TextDelta(text, entries))
            return
        for piece in tools.feed(text) if text else []:
            await put(TextDelta(piece.text) if isinstance(piece, ContentText) else piece)

    thinking = _Thinking(reasoning, logprobs)
    try:
        async with engine.generate(request) as stream:
            task_status.started()
            async for event in stream:
                if event.token_id is None and not event.is_final and event.usage is not None:
                    admitted = event.usage if usage is None else usage(event.usage)
                    await send.send(Admitted(admitted))  # `report_admission`'s first event
                    continue
                if reasoning is None:
                    answer = event.text
                    if (
                        logprobs is not None
                        and event.logprob is not None
                        and event.token_id is not None
                    ):
                        logprobs.add(event.text, event.logprob)
                else:
                    thought, answer = thinking.feed(event)
                    if thought:
                        await put(ReasoningDelta(thought))
                if answer and not matcher.stopped:
                    await emit(matcher.feed(answer))
                    if matcher.stopped or (tools is not None and tools.done):
                        stream.stop()  # ends before the next step; the final event still comes
                if event.is_final:
                    if reasoning is not None:
                        thought, answer = thinking.finish()
                        if thought:
                            await put(ReasoningDelta(thought))
                        if answer and not matcher.stopped:
                            await emit(matcher.feed(answer))
                    for output in _finish(
                        event, matcher, tools, logprobs, request.logits_processors, thinking.tokens
                    ):
                        if usage is not None and isinstance(output, Finished):
                            output = attrs.evolve(output, usage=usage(output.usage))
                        await send.send(output)
                        if observe is not None:
                            observe(output)
    # Admission errors: raised before the sequence got a lane, so before `started`.
    except (PromptTooLong, EngineOverloaded, EngineUnavailable) as exc:
        raise api_error(exc, prompt_param) from None


async def _put(send: trio.MemorySendChannel[Output], output: Output) -> None:
    """`send.send(output)` without its checkpoint while the channel has room: the loop's
    receive from the engine already checkpoints once per token, and a second scheduler pass
    per token per stream is a cost the Trio thread pays under load. Cancellation: `output`
    was sent, or (cancelled while the channel is full) it was not."""
    try:
        send.send_nowait(output)
    except trio.WouldBlock:
        await send.send(output)


def _finish(
    event: TokenEvent,
    matcher: StopMatcher,
    tools: ToolCallExtractor | None,
    logprobs: LogprobAligner | None,
    processors: tuple[Any, ...] = (),
    reasoning_tokens: int = 0,
) -> list[Output]:
    stopped_by_us = matcher.stopped or (tools is not None and tools.done)
    # No usage: the engine stopped under the sequence (its last event comes from the Trio side).
    if event.usage is None or (not stopped_by_us and event.finish_reason not in ("stop", "length")):
        for processor in processors:  # a grammar the output could not follow: the request's
            failure = getattr(processor, "failure", None)
            if event.finish_reason == "error" and failure:
                raise InvalidRequest(
                    f"the output could not be held to {processor.param}: {shortened(failure, 300)}",
                    param=processor.param,
                    code="constraint_failed",
                )
        if event.error == CONSUMER_STALLED:
            log.info("a stream's client read too slowly; its generation was stopped")
            raise ClientTooSlow(
                "the client read the stream too slowly; the server stopped the generation "
                "rather than buffer it",
                code="client_too_slow",
            )
        log.error("generation ended with %s: %s", event.finish_reason, event.error)
        if event.finish_reason == "cancelled":
            raise Unavailable(
                f"the request was cancelled by the server: {event.error}", code="server_unavailable"
            )
        raise GenerationFailed("generation failed inside the engine", code="generation_failed")
    outputs: list[Output] = []
    rest = matcher.flush()
    cut_call = False
    if tools is None:
        entries = (
            tuple(logprobs.take(rest)) + tuple(logprobs.finish()) if logprobs is not None else ()
        )
        if rest or entries:
            outputs.append(TextDelta(rest, entries))
    else:
        # A stop string that ended the text inside a call cuts it as the budget does: the
        # call comes back incomplete (or its markup, before a name, is dropped), not as text.
        pieces = (tools.feed(rest) if rest else []) + tools.finish(
            cut=event.finish_reason == "length" or matcher.stopped
        )
        outputs += [TextDelta(p.text) if isinstance(p, ContentText) else p for p in pieces]
        cut_call = any(isinstance(p, ToolCallOut) and not p.complete for p in pieces)
    reason: OpenAIFinish = "stop" if stopped_by_us else event.finish_reason  # type: ignore[assignment]
    if tools is not None and tools.calls and reason == "stop" and not cut_call:
        reason = "tool_calls"
    outputs.append(
        Finished(
            reason,
            event.usage,
            reasoning_tokens=reasoning_tokens,
            stop_sequence=matcher.matched if reason == "stop" else None,
        )
    )
    return outputs


class _Thinking:
    """A sequence's tokens through a `ReasoningSplitter`: each token's reasoning and answer
    text, the tokens spent thinking, and the answer's tokens for the logprob aligner."""

    def __init__(self, splitter: ReasoningSplitter | None, logprobs: LogprobAligner | None):
        self._splitter = splitter
        self._logprobs = logprobs
        self.tokens = 0
        """Tokens generated while thinking: those read inside the block or that opened or
        closed it."""

    def feed(self, event: TokenEvent) -> tuple[str, str]:
        """(reasoning, answer) text of one event."""
        assert self._splitter is not None
        before = self._splitter.thinking
        pieces = self._splitter.feed(event.text) if event.text else []
        thought, answer = _joined(pieces)
        if event.token_id is None:
            return thought, answer
        if before or self._splitter.thinking or thought:
            self.tokens += 1
        if self._logprobs is not None and event.logprob is not None:
            # The answer's tokens only; a token whose text was held back and released with a
            # later one (the start, a marker's prefix) is that later one's.
            if answer:
                self._logprobs.add(answer, event.logprob, exact=answer == event.text)
            elif not event.text and self._splitter.answering:  # a partial character
                self._logprobs.add("", event.logprob)
        return thought, answer

    def finish(self) -> tuple[str, str]:
        """What the splitter held back when the output ended."""
        assert self._splitter is not None
        return _joined(self._splitter.finish())


def _joined(pieces: list[AnswerPiece | ReasoningPiece]) -> tuple[str, str]:
    thought = "".join(p.text for p in pieces if isinstance(p, ReasoningPiece))
    answer = "".join(p.text for p in pieces if isinstance(p, AnswerPiece))
    return thought, answer
