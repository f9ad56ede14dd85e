"""Engine events to outputs: stop strings applied, tool calls extracted, OpenAI finish reasons.

`generate_text` runs one sequence and sends `TextDelta`s and `ToolCallOut`s, then one
`Finished`, to a channel. It raises the OpenAI-layer error of a failed sequence. The
caller owns the task and its deadline (see `http._jobs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import attrs
import trio

from ..engine import (
    Engine,
    EngineOverloaded,
    EngineUnavailable,
    GenerationRequest,
    PromptTooLong,
    TokenEvent,
    Usage,
)
from ._errors import GenerationFailed, InvalidRequest, Overloaded, Unavailable, shortened
from ._logprobs import LogprobAligner, LogprobEntry
from ._stop import StopMatcher
from ._tools import ContentText, ToolCallExtractor, ToolCallOut

log = logging.getLogger("mlx_nursery.openai")

OpenAIFinish = Literal["stop", "length", "tool_calls"]


@attrs.frozen
class TextDelta:
    text: str
    logprobs: tuple[LogprobEntry, ...] = ()
    """Entries for the tokens this text completes (when logprobs were asked for)."""


@attrs.frozen
class Finished:
    reason: OpenAIFinish
    usage: Usage
    stop_sequence: str | None = None
    """The stop string that ended the text ("stop" only; the Messages API reports it)."""


Output = TextDelta | ToolCallOut | Finished


async def generate_text(
    engine: Engine,
    request: GenerationRequest,
    stops: tuple[str, ...],
    send: trio.MemorySendChannel[Output],
    *,
    prompt_param: str = "messages",
    tools: ToolCallExtractor | None = None,
    logprobs: LogprobAligner | None = None,
    observe: Callable[[Output], None] | None = None,
    usage: Callable[[Usage], Usage] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Generate, reporting `started` once the sequence holds a lane (errors before that raise).
    `observe` sees each output once it is sent (metrics). `usage` rewrites the usage
    reported (the scripted model's `script.usage`).

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

    try:
        async with engine.generate(request) as stream:
            task_status.started()
            async for event in stream:
                if (
                    logprobs is not None
                    and event.logprob is not None
                    and event.token_id is not None
                ):
                    logprobs.add(event.text, event.logprob)
                if event.text and not matcher.stopped:
                    await emit(matcher.feed(event.text))
                    if matcher.stopped or (tools is not None and tools.done):
                        stream.stop()  # ends before the next step; the final event still comes
                if event.is_final:
                    for output in _finish(
                        event, matcher, tools, logprobs, request.logits_processors
                    ):
                        if usage is not None and isinstance(output, Finished):
                            output = attrs.evolve(output, usage=usage(output.usage))
                        await send.send(output)
                        if observe is not None:
                            observe(output)
    # Admission errors: raised before the sequence got a lane, so before `started`.
    except PromptTooLong as exc:
        raise context_length_error(exc, prompt_param) from None
    except EngineOverloaded as exc:
        raise Overloaded(
            f"the server is at capacity ({exc.queued} requests waiting); retry later",
            code="server_overloaded",
        ) from None
    except EngineUnavailable:
        raise Unavailable(
            "the server is not serving (shutting down or stopped)", code="server_unavailable"
        ) from None


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
        log.error("generation ended with %s: %s", event.finish_reason, event.error)
        if event.finish_reason == "cancelled":
            raise Unavailable(
                f"the request was cancelled by the server: {event.error}", code="server_unavailable"
            )
        raise GenerationFailed("generation failed inside the engine", code="generation_failed")
    outputs: list[Output] = []
    rest = matcher.flush()
    if tools is None:
        entries = (
            tuple(logprobs.take(rest)) + tuple(logprobs.finish()) if logprobs is not None else ()
        )
        if rest or entries:
            outputs.append(TextDelta(rest, entries))
    else:
        pieces = (tools.feed(rest) if rest else []) + tools.finish(
            cut=event.finish_reason == "length"
        )
        outputs += [TextDelta(p.text) if isinstance(p, ContentText) else p for p in pieces]
    reason: OpenAIFinish = "stop" if stopped_by_us else event.finish_reason  # type: ignore[assignment]
    if tools is not None and tools.calls and reason == "stop":
        reason = "tool_calls"
    outputs.append(Finished(reason, event.usage, matcher.matched if reason == "stop" else None))
    return outputs


def context_length_error(exc: PromptTooLong, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"This model's maximum context length is {exc.context_length} tokens. However, you "
        f"requested {exc.prompt_tokens + exc.max_tokens} tokens ({exc.prompt_tokens} in the "
        f"prompt, {exc.max_tokens} for the completion). Please reduce the prompt or the "
        "completion length.",
        param=param,
        code="context_length_exceeded",
    )
