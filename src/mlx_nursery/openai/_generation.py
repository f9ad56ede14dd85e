"""Engine events to text: stop strings applied, finish reasons in OpenAI's terms.

`generate_text` runs one sequence and sends `TextDelta`s then one `Finished`
to a channel. It raises the OpenAI-layer error for a failed sequence. The
caller owns the task and its deadline (see `http._jobs`).
"""

from __future__ import annotations

import logging
from typing import Literal

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
from ._errors import GenerationFailed, InvalidRequest, Overloaded, Unavailable
from ._stop import StopMatcher

log = logging.getLogger("mlx_nursery.openai")

OpenAIFinish = Literal["stop", "length"]


@attrs.frozen
class TextDelta:
    text: str


@attrs.frozen
class Finished:
    reason: OpenAIFinish
    usage: Usage
    text: str = ""
    """Text held back for a possible stop string, released at the end."""


Output = TextDelta | Finished


async def generate_text(
    engine: Engine,
    request: GenerationRequest,
    stops: tuple[str, ...],
    send: trio.MemorySendChannel[Output],
    *,
    prompt_param: str = "messages",
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Generate, reporting `started` once the sequence holds a lane (errors before that raise)."""
    matcher = StopMatcher(stops)
    try:
        async with engine.generate(request) as stream:
            task_status.started()
            async for event in stream:
                if event.text and not matcher.stopped:
                    text = matcher.feed(event.text)
                    if text:
                        await send.send(TextDelta(text))
                    if matcher.stopped:
                        stream.stop()  # ends before the next step; the final event still comes
                if event.is_final:
                    await send.send(_finish(event, matcher))
    # Admission errors: raised before the sequence got a lane, so before `started`.
    except PromptTooLong as exc:
        raise context_length_error(exc, prompt_param) from None
    except EngineOverloaded as exc:
        raise Overloaded(f"the server is at capacity ({exc.queued} requests waiting); retry later",
                         code="server_overloaded") from None
    except EngineUnavailable:
        raise Unavailable("the server is not serving (shutting down or stopped)",
                          code="server_unavailable") from None


def _finish(event: TokenEvent, matcher: StopMatcher) -> Finished:
    assert event.usage is not None
    if matcher.stopped:
        return Finished("stop", event.usage)
    if event.finish_reason == "stop" or event.finish_reason == "length":
        return Finished(event.finish_reason, event.usage, matcher.flush())
    log.error("generation ended with %s: %s", event.finish_reason, event.error)
    if event.finish_reason == "cancelled":
        raise Unavailable(f"the request was cancelled by the server: {event.error}",
                          code="server_unavailable")
    raise GenerationFailed("generation failed inside the engine", code="generation_failed")


def context_length_error(exc: PromptTooLong, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"This model's maximum context length is {exc.context_length} tokens. However, you "
        f"requested {exc.prompt_tokens + exc.max_tokens} tokens ({exc.prompt_tokens} in the "
        f"prompt, {exc.max_tokens} for the completion). Please reduce the prompt or the "
        "completion length.",
        param=param, code="context_length_exceeded",
    )
