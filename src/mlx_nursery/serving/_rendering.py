"""How a generation's output becomes a wire format: one renderer per API and output shape,
with one method per kind of output, and the one dispatch over the kinds.

A `StreamRenderer` renders a stream's pieces as bytes to write (chat and completions chunks,
the Responses and Messages named events); a `BodyRenderer` gathers the pieces and renders
the whole body at the end. `RenderedStream` is the stream renderer as the pump takes it
(http/_pump.py) and `collect` the whole body from a job: the output's kinds are told apart
here and nowhere else.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, TypeVar

import attrs

from .. import fault_points
from ..generation import Admitted, Finished, OpenAIError, ReasoningDelta, TextDelta, ToolCallOut
from ._batching import merged_text
from ._job import Job, JobItem

log = logging.getLogger("mlx_nursery.http")

T_co = TypeVar("T_co", covariant=True)


class PieceRenderer(Protocol[T_co]):
    """One method per kind of output before the end."""

    def admitted(self, item: Admitted) -> T_co:
        """The prompt's usage, before any output (only a request that asked for it)."""
        ...

    def text(self, item: TextDelta) -> T_co: ...

    def reasoning(self, item: ReasoningDelta) -> T_co: ...

    def call(self, item: ToolCallOut) -> T_co: ...


class StreamRenderer(PieceRenderer[bytes], Protocol):
    """A stream's wire format: each piece as bytes to write."""

    def opening(self) -> bytes:
        """What the stream writes before the job's first output (may be empty)."""
        ...

    async def finish(self, item: Finished) -> bytes:
        """The stream's last write for the generation's end."""
        ...

    async def error(self, error: OpenAIError) -> bytes:
        """The event that ends the stream with `error` (a Responses stream stores its failed
        response first). Cancellation: a checkpoint."""
        ...


class BodyRenderer(PieceRenderer[None], Protocol):
    """A whole response's wire format: the pieces gathered, the body rendered at the end."""

    async def finish(self, item: Finished) -> dict[str, Any]:
        """The response's body, the generation ended."""
        ...


def render_piece(renderer: PieceRenderer[T_co], item: JobItem) -> T_co:
    """`item` (any output but the end and an error) through the renderer's method for it."""
    if isinstance(item, TextDelta):
        return renderer.text(item)
    if isinstance(item, ReasoningDelta):
        return renderer.reasoning(item)
    if isinstance(item, ToolCallOut):
        return renderer.call(item)
    if isinstance(item, Admitted):
        return renderer.admitted(item)
    raise TypeError(f"not a piece of output: {type(item).__name__}")


@attrs.define
class RenderedStream:
    """A `StreamRenderer` as the pump takes it (`StreamFormat`): consecutive text in one
    delta, the stream ended by the generation's end or an error."""

    renderer: StreamRenderer

    def opening(self) -> bytes:
        return self.renderer.opening()

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        """One write's bytes for `items`, and whether the stream ends with them."""
        out: list[bytes] = []
        for item in items if len(items) == 1 else merged_text(items):
            if isinstance(item, Finished):
                out.append(await self.renderer.finish(item))
                return b"".join(out), True
            if isinstance(item, OpenAIError):
                out.append(await self.renderer.error(item))
                return b"".join(out), True
            out.append(render_piece(self.renderer, item))
        return b"".join(out), False

    async def error(self, error: OpenAIError) -> bytes:
        return await self.renderer.error(error)


async def collect(job: Job, renderer: BodyRenderer) -> dict[str, Any]:
    """A non-streaming response's body: the job's whole output as `renderer` renders it,
    once the job is gone. Raises the job's error. Cancellation: the job ends with the
    request."""
    async for item in job.receive:
        if isinstance(item, OpenAIError):
            raise item  # to the app's one handler, as every error
        if isinstance(item, Finished):
            await job.settled()
            fault_points.reach("rendering")
            return await renderer.finish(item)
        render_piece(renderer, item)
    raise ended_early()


def ended_early() -> OpenAIError:
    """The error of a job whose output ended without a result (a bug: it always sends one)."""
    log.error("a generation job ended without a result")
    return OpenAIError("the generation ended unexpectedly", code="internal_error")
