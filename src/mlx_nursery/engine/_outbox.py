"""The engine thread's one way out: events and confirmations, posted by one rule.

Every token, every final event and every confirmation that a sequence is gone leaves the
engine thread through the `Outbox`; nothing else calls `post`. A final event always comes
with its confirmation, in the same delivery, so a caller that sees its sequence's end may
rely on the sequence computing nothing more.

The posting rule (`post_due`): post what is pending, except while a lone sequence on the
fast path has its next token in flight and nothing has ended: then its token waits for the
fast path's next launch (`post_at_launch`, called once that token's graph is built). A lone
stream of a large model is bound by this thread; a token posted as soon as it is read wakes
the receiving thread in the middle of the next graph build, which then competes for the
GIL; posted just before the launch (which releases the GIL) it is taken at once. It reaches
the consumer at about the same time either way (docs/architecture.md, "Posting rule").
A first token or a final event is never held back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

import attrs

from ._messages import Delivery, StepEvent, WorkerStats

CALLER_HEADSTART_SECONDS = 0.002
"""Longest the engine thread waits for a caller to see an end before detaching (see
`Outbox.wait_for_caller`)."""


class Outbox:
    """Pending events of the engine thread, and the one rule by which they are posted."""

    def __init__(self, post: Callable[[Delivery], None], stats: Callable[[], WorkerStats]) -> None:
        self._post = post
        self._stats = stats
        self._events: list[tuple[int, StepEvent]] = []
        self._finished: list[int] = []
        self._suspended: list[int] = []
        self._kept: list[int] = []
        self._caller_saw_end = threading.Event()

    def token(self, seq_id: int, event: StepEvent) -> None:
        """A sequence's next token (not its last)."""
        self._events.append((seq_id, event))

    def end(self, seq_id: int, event: StepEvent) -> None:
        """A sequence's final event, and the confirmation that it computes nothing more."""
        self._events.append((seq_id, event))
        self._finished.append(seq_id)

    def suspended(self, seq_id: int) -> None:
        """A sequence is off the device (its lane may go to another): posted after the events
        it had pending, never held back."""
        self._suspended.append(seq_id)

    def kept(self, seq_id: int) -> None:
        """A suspension could not be done (the sequence ended, or is not running)."""
        self._kept.append(seq_id)

    @property
    def confirming(self) -> bool:
        """Confirmations are pending (the posting rule never holds them back)."""
        return bool(self._finished)

    def post_due(self, *, token_in_flight: bool) -> None:
        """Post what is pending unless the posting rule defers it to the next launch."""
        if token_in_flight and not (self._finished or self._suspended or self._kept):
            return
        self.post()

    def post_at_launch(self) -> None:
        """Called by the fast path just before it launches a token: post what waited."""
        self.post()

    def post(
        self, *, force: bool = False, closing: Literal["closed", "failed"] | None = None
    ) -> None:
        """Post everything pending (with fresh statistics if `force`, and on the last post)."""
        answers = self._suspended or self._kept
        if not (self._events or self._finished or answers or force or closing):
            return
        delivery = Delivery(self._events, self._finished, self._stats(), closing)
        if answers:
            delivery = attrs.evolve(delivery, suspended=self._suspended, kept=self._kept)
            self._suspended, self._kept = [], []
        if self._finished:
            self._caller_saw_end.clear()  # only confirmations are waited for
        self._events, self._finished = [], []
        self._post(delivery)

    # -- the head start ---------------------------------------------------------------------
    def caller_saw_end(self) -> None:
        """Any thread: a caller has seen a sequence's end (a final event, or the confirmation
        it waited for after a cancel)."""
        self._caller_saw_end.set()

    def wait_for_caller(self) -> None:
        """Before detaching what ended: give the caller a short head start to take its
        confirmation.

        Detaching runs a millisecond or two of Python holding the GIL (slicing every layer's
        KV), which the receiving thread needs to take a confirmation; the step in flight
        keeps the device busy meanwhile. Safety does not depend on it: the confirmation has
        been posted and nothing is stepped before the detach, so the wait is bounded by
        `CALLER_HEADSTART_SECONDS` and can cost latency only, never correctness. An end seen
        earlier may end the wait early: it is a head start, not a handshake.
        """
        self._caller_saw_end.wait(CALLER_HEADSTART_SECONDS)
