"""Embedding requests on one model: each in its own cancel scope, which its deadline, its
client leaving and the server's drain cancel.

Unlike a generation, an embedding request runs in its handler's own task, not in a job:
its answer is one JSON body written after the compute, so no response is being written
while it computes, and Quart-Trio's cancellation of the handler when the client leaves
reaches the compute directly, as a cancel by the request's id does (`_live.py`). What a job
gives generations is kept: the model counts as busy while one runs (it is never unloaded
under it), and a drain refuses new ones, gives the running ones the grace period, then
cancels them with the shutdown error.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np
import trio

from ..engine import Embedder, EmbeddingRequest
from ..generation import OpenAIError, Unavailable, request_cancelled, request_timed_out
from ..openai import run_embeddings
from ._job import CancelReason, Intake
from ._live import LiveRequest
from ._metrics import Metrics
from ._request_log import RequestRecord


@attrs.define(eq=False)
class _Call:
    scope: trio.CancelScope
    reason: CancelReason = "timeout"
    over: bool = False
    """Its compute has ended (`_live.Stoppable`)."""

    def cancel(self, reason: CancelReason) -> None:
        """Stop the call's compute before its next forward; the first reason wins."""
        if not self.scope.cancel_called:
            self.reason = reason
            self.scope.cancel()


class EmbeddingCalls:
    def __init__(
        self,
        embedder: Embedder,
        timeout: float | None,
        metrics: Metrics | None = None,
        model_name: str = "",
    ) -> None:
        self._embedder = embedder
        self._timeout = timeout
        self._metrics = metrics
        self._model_name = model_name
        self._active: set[_Call] = set()
        self._idle = trio.Event()
        self._idle.set()
        self._intake = Intake()

    @property
    def busy(self) -> bool:
        """Whether a request is computing on the model (it must stay loaded)."""
        return bool(self._active)

    async def run(
        self,
        request: EmbeddingRequest,
        deadline: float,
        record: RequestRecord | None,
        live: LiveRequest | None = None,
    ) -> list[np.ndarray]:
        """The request's vectors. Raises what `run_embeddings` raises; 504 past `deadline`,
        503 once a drain has begun or when it cancels the request, 409 when a cancel by the
        request's id (`live`'s) stops it.

        Cancellation: the caller's cancellation (its client left) stops the compute before
        the next forward and returns once the engine confirms it (`Embedder.embed`)."""
        self._intake.check()
        call = _Call(trio.CancelScope(deadline=deadline))
        self._active.add(call)
        if self._idle.is_set():
            self._idle = trio.Event()
        if live is not None:
            live.hold(call)
        try:
            with call.scope:
                vectors = await run_embeddings(self._embedder, request)
                if self._metrics is not None:
                    self._metrics.prompt_tokens.labels(self._model_name).inc(request.tokens)
                return vectors
            self._cancelled(record, call.reason)
            if call.reason == "shutdown":
                raise Unavailable(
                    "the server is shutting down; the request was cancelled",
                    code="server_shutting_down",
                )
            if call.reason == "cancel" and live is not None:
                raise request_cancelled(live.request_id)
            raise request_timed_out(self._timeout or 0)
        except trio.Cancelled:
            self._cancelled(record, "client")
            raise
        finally:
            call.over = True
            self._active.discard(call)
            if not self._active:
                self._idle.set()

    def _cancelled(self, record: RequestRecord | None, cause: CancelReason) -> None:
        if record is not None:
            record.cancel_cause = cause
        if self._metrics is not None:
            self._metrics.cancelled.labels(self._model_name, cause).inc()

    def refuse(self, error: Callable[[], OpenAIError]) -> None:
        """Refuse every later request with `error()` (the model is going away), as
        `Jobs.refuse`. Not a checkpoint."""
        self._intake.refusal = error

    async def settled(self) -> None:
        """Wait until no call runs. Cancellation: stops the wait only."""
        await self._idle.wait()

    async def drain(self, grace: float) -> None:
        """Refuse new requests from now on, let running ones finish for up to `grace`
        seconds, then cancel the rest (their clients get the shutdown 503)."""
        self._intake.closed = True
        with trio.move_on_after(grace):
            await self._idle.wait()
        for call in list(self._active):
            call.cancel("shutdown")
