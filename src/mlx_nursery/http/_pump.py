"""The one pump from a job to an SSE body, for chat, completions and Responses streams.

The pump owns what every stream must do: count itself open (the write interval follows the
streams open, `_batching.py`), batch the job's output into writes, end with an event
whatever happens (the job's end, its output ending without one, a failure while rendering),
and log a failure with the request id. A `StreamFormat` only renders: its opening, a batch
of items, an error.

The pump never cancels the job: the request's end does (`_lifetime.py`), which also covers
a client gone before the body's first byte, when this generator has never run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from .. import fault_points
from ..generation import ConnectionDropped, OpenAIError
from ..serving import (
    Job,
    JobItem,
    WriteBatcher,
    WritePolicy,
    ended_early,
    internal_error,
    log_failure,
)

DROP_CONNECTION = b"\x00mlx-nursery: drop the connection\x00"
"""Yielded by a stream's body where its connection is to be cut (a job ended with a
`ConnectionDropped`: an extension's fault, `serving/_extensions.py`). The extension that
makes such faults wraps the app in the ASGI wrapper that cuts the connection there. SSE
events are JSON text: no event holds a NUL byte."""


class StreamFormat(Protocol):
    """How one kind of stream renders a job's output as bytes to write."""

    def opening(self) -> bytes:
        """What the stream writes before the job's first output (may be empty)."""
        ...

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        """One write's bytes for `items`, and whether the stream ends with them."""
        ...

    async def error(self, error: OpenAIError) -> bytes:
        """The event that ends the stream with `error`. Cancellation: a checkpoint."""
        ...


async def pump(
    job: Job, format: StreamFormat, writes: WritePolicy, request_id: str
) -> AsyncIterator[bytes]:
    """The body of a stream: whatever the job produced since the last write goes out in one
    write (when the server is busy, its cost per token drops instead of its backlog
    growing); after the first write, `writes` says how many pieces a write waits for. A
    failure while rendering ends the stream with an error event (logged with `request_id`),
    never a cut stream."""
    with writes.stream():
        try:
            opening = format.opening()
            if opening:
                yield opening
            batches = WriteBatcher(job.receive, writes)
            while (items := await batches.next()) is not None:
                drop = next(
                    (i for i, x in enumerate(items) if isinstance(x, ConnectionDropped)), -1
                )
                if drop >= 0:  # what came before goes out, then the connection is cut
                    if drop:
                        yield (await format.render(items[:drop]))[0]
                    yield DROP_CONNECTION
                    return
                fault_points.reach("rendering")
                write, ended = await format.render(items)
                if ended:
                    await job.settled()  # the client's whole answer: the job is gone by then
                yield write
                if ended:
                    return
            yield await format.error(ended_early())
        except Exception as exc:  # noqa: BLE001 - the stream still ends with an event
            log_failure(request_id, "while streaming", exc)
            yield await format.error(internal_error(request_id))
