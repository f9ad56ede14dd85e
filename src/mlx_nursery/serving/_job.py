"""A job as its request holds it: the channel of its outputs, its cancel scope, why it was
cancelled, and when its task ended (`_jobs.py` starts and contains the task)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

import attrs
import trio

from ..engine import AudioChunk, Synthesized, Transcript, Window
from ..generation import OpenAIError, Output, Unavailable

CancelReason = Literal["timeout", "client", "shutdown", "cancel"]
"""Why a job was cancelled: its deadline; its request ended first (the client left, or the
response was cut short: see `_lifetime.py`); the server's drain; a cancel by the request's
id (`_live.py`)."""
JobItem = Output | Window | Transcript | AudioChunk | Synthesized | OpenAIError
"""A generation's outputs, a transcription's (its windows, then its transcript), a
synthesis's (its chunks, then `Synthesized`), or the error that ends any of them."""


@attrs.define(eq=False)
class Job:
    receive: trio.MemoryReceiveChannel[JobItem]
    scope: trio.CancelScope
    reason: CancelReason = "timeout"
    ended: trio.Event = attrs.Factory(trio.Event)
    """Set once the job's task has ended: its model is no longer busy with it."""

    @property
    def over(self) -> bool:
        """Whether the job's task has ended (`_live.Stoppable`)."""
        return self.ended.is_set()

    async def settled(self) -> None:
        """Wait for the job's task to end, which follows its last output at once (bounded:
        a second). A response waits for it before its last bytes, so that a client that
        has its whole answer and asks again (another model, an unload) finds this job
        gone. Cancellation: returns at once, as any wait."""
        with trio.move_on_after(1):
            await self.ended.wait()

    def cancel(self, reason: CancelReason) -> None:
        """Stop the job's compute (within one engine step); idempotent, first reason wins."""
        if not self.scope.cancel_called:
            self.reason = reason
            self.scope.cancel()


class JobTask(Protocol):
    """A job's task, started by `Jobs._launch`: its outputs into `send`."""

    def __call__(
        self,
        job: Job,
        send: trio.MemorySendChannel[JobItem],
        *,
        task_status: trio.TaskStatus[None],
    ) -> Awaitable[None]: ...


@attrs.frozen
class Started:
    """A task_status that tells the job it started, then passes the signal on."""

    on_started: object

    def started(self, value: None = None) -> None:
        self.on_started(value)  # type: ignore[operator]


@attrs.define
class Intake:
    """Whether a model's work is still taken (by `Jobs`, `EmbeddingCalls`): a drain closes
    it (the shutdown 503); a model going away refuses it with an error of its own."""

    closed: bool = False
    refusal: Callable[[], OpenAIError] | None = None

    def check(self) -> None:
        """Raise what new work is refused with now, if anything. Not a checkpoint."""
        if self.closed:
            raise Unavailable("the server is shutting down", code="server_shutting_down")
        if self.refusal is not None:
            raise self.refusal()


def model_restarting() -> OpenAIError:
    return Unavailable(
        "the model's engine stopped and is restarting; retry shortly", code="model_restarting"
    )


def model_unloaded() -> OpenAIError:
    return Unavailable("the model was unloaded; retry to load it again", code="model_unloaded")
