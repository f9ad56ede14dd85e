"""Preparing requests off the Trio thread: parsing, validation, templates, tokenizing and
media decoding on a few worker threads, and remote images fetched within the server's bound.

Requests are prepared a few at a time (`PREPARE_THREADS`), so that no request's input
stalls the Trio thread (other streams, /health) and one slow preparation holds one thread.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TypeVar

import trio

from ..generation import (
    ImageRef,
    MediaFetches,
    RequestTimeout,
    ServedModel,
    check_before_fetching,
    fetch_images,
    request_timed_out,
)

T = TypeVar("T")

PREPARE_THREADS = 4
"""Requests prepared at once, each on a thread of its own, so one slow preparation (a
request's images or audio decoded within its limits) holds one thread, not every request's
way in. What they share is thread-safe: the tokenizer (a Hugging Face fast tokenizer is one
Rust object; concurrent encodes are shared borrows, and nothing on our path changes its
truncation or padding, whose reset would be the mutable borrow that fails with "Already
borrowed", huggingface/tokenizers#537: `_vocabulary`'s warm-up absorbs the one-time reset),
the segment cache (a lock), the VLM processor (a lock). Why four, and what one cost:
docs/architecture.md ("Preparation")."""


class Preparation:
    """The preparation pool and the image fetches, bounded by the request timeout."""

    def __init__(self, request_timeout: float | None, fetches: MediaFetches) -> None:
        self.request_timeout = request_timeout
        self.fetches = fetches
        """The server's image fetches: how many at once, the bytes they hold."""
        self._preparing = trio.CapacityLimiter(PREPARE_THREADS)

    def deadline(self) -> float:
        """The deadline of a request that starts now (the request timeout; inf without one)."""
        timeout = self.request_timeout
        return trio.current_time() + timeout if timeout else math.inf

    async def prepare(self, work: Callable[[], T], deadline: float) -> T:
        """Run `work` (a request's parsing, validation, template, tokenizing, media decoding)
        on a worker thread, so that no request's input stalls the Trio thread: other streams
        and /health.

        Waits (FIFO) for one of the `PREPARE_THREADS` slots. Raises RequestTimeout past
        `deadline`. Cancellation (a disconnect, the deadline) returns at once and abandons the
        thread: it runs on to its next check (`openai._checkpoint`: before each costly step)
        or its end, and holds its slot until then.
        """
        with trio.move_on_at(deadline) as scope:
            return await trio.to_thread.run_sync(
                work, limiter=self._preparing, abandon_on_cancel=True
            )
        assert scope.cancelled_caught
        raise self._timed_out()

    @asynccontextmanager
    async def fetched(
        self, served: ServedModel, images: Iterable[ImageRef], deadline: float
    ) -> AsyncIterator[ServedModel]:
        """`served` with the request's remote images fetched, for the block (prepare the
        request in it: the fetched bytes count against the server's limit until it ends).
        With remote images to fetch, the request's images are first checked as its
        preparation would check them (`check_before_fetching`). Raises RequestTimeout past
        `deadline`, InvalidRequest for images refused or a fetch that fails, Overloaded past
        the server's fetched bytes. Cancelled with the request."""
        limits = served.image_limits
        wanted = list(images)
        if not limits.hosts or not any(image.remote for image in wanted):
            yield served
            return
        check_before_fetching(wanted, limits, served.vision is not None)
        hold = self.fetches.hold()
        try:
            with trio.move_on_at(deadline) as scope:
                fetched = await fetch_images(wanted, limits, hold)
            if scope.cancelled_caught:
                raise self._timed_out()
            yield served.with_fetched(fetched)
        finally:
            hold.release()

    @property
    def preparing(self) -> int:
        """Preparation threads busy now, abandoned ones included (tests, statistics)."""
        return int(self._preparing.borrowed_tokens)

    def _timed_out(self) -> RequestTimeout:
        return request_timed_out(self.request_timeout or 0)
