"""How much of a job's output goes into one SSE write.

Under load, a server's cost per token is mostly its writes: with many streams a profile puts
most of the Trio thread in Hypercorn's send path (one shielded send per chunk per stream),
and on a GPU that thread shares the GIL with the engine's. So a stream writes
whatever is ready at once, and, with an interval above 1, waits after its first write until
that many pieces of text are ready, unless something else comes first (a tool call, the
end, an error), which is never held back. The first write is never held back either: time
to first token stays what it was.

The interval is fixed (`--stream-interval N`) or follows the load (the default, 0): one
piece per write while few streams are open, one more for every `STREAMS_PER_PIECE` streams
beyond. A lone stream is written token by token, as OpenAI streams; many streams are
written a few tokens at a time. On a GPU under many streams that raised the server's
throughput, by less once the engine's GC heap was frozen (docs/benchmarks.md, "Findings
behind the current design"). At such a load a stream's tokens come often enough that a few
of them together still read as a steady stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import trio

from ..generation import ReasoningDelta, TextDelta
from ._job import JobItem

STREAMS_PER_PIECE = 8
"""With the adaptive interval: open streams per piece of text in a write (1-8 streams: 1)."""


@attrs.define
class WritePolicy:
    """The server-wide rule for a stream's write interval, and the streams open now."""

    fixed: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Pieces per write after the first; 0 adapts to the number of open streams."""
    open_streams: int = 0

    def interval(self) -> int:
        if self.fixed:
            return self.fixed
        return 1 + max(self.open_streams - 1, 0) // STREAMS_PER_PIECE

    @contextmanager
    def stream(self) -> Iterator[None]:
        """Count a stream as open for the duration of the block."""
        self.open_streams += 1
        try:
            yield
        finally:
            self.open_streams -= 1


def ready_items(receive: trio.MemoryReceiveChannel[JobItem]) -> list[JobItem]:
    """The items already waiting, without blocking."""
    items: list[JobItem] = []
    while True:
        try:
            items.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return items


def merged_text(items: list[JobItem]) -> list[JobItem]:
    """`items` with each run of text pieces (or of reasoning pieces) joined into one: one delta
    per write, not per token."""
    merged: list[JobItem] = []
    for item in items:
        previous = merged[-1] if merged else None
        if isinstance(item, TextDelta) and isinstance(previous, TextDelta):
            merged[-1] = TextDelta(previous.text + item.text, previous.logprobs + item.logprobs)
        elif isinstance(item, ReasoningDelta) and isinstance(previous, ReasoningDelta):
            merged[-1] = ReasoningDelta(previous.text + item.text)
        else:
            merged.append(item)
    return merged


_TEXT = (TextDelta, ReasoningDelta)
"""Pieces of text a write may wait for (anything else goes out at once)."""


class WriteBatcher:
    def __init__(self, receive: trio.MemoryReceiveChannel[JobItem], policy: WritePolicy) -> None:
        self._receive = receive
        self._policy = policy
        self._written = False

    async def next(self) -> list[JobItem] | None:
        """The items for the next write; None once the job's output has ended."""
        try:
            batch = [await self._receive.receive(), *ready_items(self._receive)]
        except trio.EndOfChannel:
            return None
        if self._written:
            interval = self._policy.interval()
            while len(batch) < interval and all(isinstance(i, _TEXT) for i in batch):
                try:
                    batch.append(await self._receive.receive())
                except trio.EndOfChannel:
                    break
                batch.extend(ready_items(self._receive))
        self._written = True
        return batch
