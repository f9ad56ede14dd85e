"""One background response while it runs (`BackgroundRun`), and the steps of its task
(`BackgroundTask`): wait for a lane, follow the job's output, store the response as it
goes and at its end. `_background.py` starts the task, finds runs and cancels them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..generation import (
    Admitted,
    Finished,
    OpenAIError,
    ReasoningDelta,
    TextDelta,
    ToolCallOut,
)
from ..openai import PreparedResponse, ResponseBuilder
from ..store import ResponsesStorage, StoredResponse
from ._batching import WriteBatcher, WritePolicy, merged_text
from ._failures import internal_error, log_failure
from ._job import Job
from ._rendering import ended_early, render_piece

if TYPE_CHECKING:  # the choreography imports the service, which holds these
    from ._generations import JobStarter


@attrs.define(eq=False)
class BackgroundRun:
    """One background response while its task runs: what it renders with, its job, and
    what others wait on (its stored events, its end)."""

    prepared: PreparedResponse
    builder: ResponseBuilder
    owner: str | None
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    """Its wait for a lane."""
    job: Job | None = None
    registered: bool = False
    """Its job keeps its model busy (the creating request may return)."""
    cancel_requested: bool = False
    announced: trio.Event = attrs.Factory(trio.Event)
    """Set once the creating request stored it queued (or failed to)."""
    abandoned: bool = False
    """Its creation failed: nothing more of it is stored."""
    changed: trio.Event = attrs.Factory(trio.Event)
    """Set (and replaced) whenever events were stored, and at the end."""
    ended: trio.Event = attrs.Factory(trio.Event)

    @property
    def id(self) -> str:
        return self.prepared.id

    @property
    def stream(self) -> bool:
        """Its events are stored (it was made with `stream: true`)."""
        return bool(self.prepared.prepared.stream)

    def cancel(self) -> None:
        """Stop its compute: its wait for a lane at once, its job within a step. Idempotent;
        not a checkpoint."""
        self.cancel_requested = True
        self.scope.cancel()
        if self.job is not None:
            self.job.cancel("client")

    def notify(self) -> None:
        """Wake whoever waits for its next stored events (or its end). Not a checkpoint."""
        self.changed.set()
        self.changed = trio.Event()


class _Pieces:
    """A job's pieces of output as the Responses stream's events (`PieceRenderer`)."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self._builder = builder

    def admitted(self, item: Admitted) -> list[dict[str, Any]]:
        return []

    def text(self, item: TextDelta) -> list[dict[str, Any]]:
        return self._builder.text(item.text, item.logprobs)

    def reasoning(self, item: ReasoningDelta) -> list[dict[str, Any]]:
        return self._builder.reasoning(item.text)

    def call(self, item: ToolCallOut) -> list[dict[str, Any]]:
        return self._builder.call(item)


@attrs.frozen
class BackgroundTask:
    """The steps of a background response's task, on the store and the write policy."""

    store: ResponsesStorage
    writes: WritePolicy

    async def admitted(
        self, run: BackgroundRun, starter: JobStarter, task_status: trio.TaskStatus[None]
    ) -> tuple[Job | None, OpenAIError | None]:
        """Its job, holding a lane; or why there is none: the error that refused it, or
        (None, None) cancelled while queued. `task_status` is told once the job is
        registered; what refuses it before that is raised. Cancellation: `run.scope`'s is
        caught (nothing was computed); any other propagates."""

        def report() -> None:
            run.registered = True
            task_status.started()

        try:
            with run.scope:
                return await starter.start(report), None
        except OpenAIError as error:
            if not run.registered:
                raise
            return None, error
        return None, None

    async def follow(
        self, run: BackgroundRun, job: Job | None, failure: OpenAIError | None
    ) -> None:
        """Once the creating request stored it queued: in progress, its output, its end
        (or, without a job, its end at once: `failure`, or cancelled). Cancellation: a
        checkpoint; cancelled, the job is left to its own scope (the models' drain)."""
        await run.announced.wait()
        if run.abandoned or job is None:
            if job is not None:
                job.cancel("client")
            if not run.abandoned:
                await self._end(run, failure)
            return
        run.job = job
        if run.cancel_requested:
            job.cancel("client")
        await self._save(run, run.builder.started())
        await self._end(run, await self._consume(run, job))

    async def fail(self, run: BackgroundRun, job: Job | None) -> None:
        """After a failure of its own task: its job stopped, stored failed if the store
        takes it (else left unfinished, for the next start to settle). Cancellation: a
        checkpoint; cancelled, it is left unfinished likewise."""
        if job is not None:
            job.cancel("client")
        run.cancel_requested = False  # it failed, whoever asked to cancel it
        try:
            await self._end(run, internal_error(run.id))
        except Exception as exc:  # noqa: BLE001 - logged; the next start settles it
            log_failure(run.id, "while storing its failure", exc)

    def record(
        self, run: BackgroundRun, body: dict[str, Any] | None = None, *, finished: bool = False
    ) -> StoredResponse:
        """The response to store: as it stands (or `body`), this process's while unfinished.
        Not a checkpoint."""
        return StoredResponse(
            run.id,
            time.time(),  # the store's order
            run.builder.response() if body is None else body,
            run.prepared.input_items,
            run.builder.conversation(),
            run.owner,
            None if finished else self.store.runner,
        )

    async def _consume(self, run: BackgroundRun, job: Job) -> Finished | OpenAIError:
        """The job's output through the run's builder, a stream's events stored batch by
        batch; its end (the result, or the error that ended it)."""
        pieces = _Pieces(run.builder)
        batches = WriteBatcher(job.receive, self.writes)
        while (items := await batches.next()) is not None:
            events: list[dict[str, Any]] = []
            end: Finished | OpenAIError | None = None
            for item in items if len(items) == 1 else merged_text(items):
                if isinstance(item, Finished | OpenAIError):
                    end = item
                    break
                events += render_piece(pieces, item)
            if run.stream and events:
                await self.store.append_events(run.id, events)
                run.notify()
            if end is not None:
                return end
        return ended_early()

    async def _end(self, run: BackgroundRun, end: Finished | OpenAIError | None) -> None:
        """Store its end once its compute is over: its result, cancelled (asked, or no
        error), or failed with the error."""
        builder = run.builder
        if isinstance(end, Finished):
            events = [*builder.finish(end), builder.final_event()]
        else:
            events = [builder.stopped(None if run.cancel_requested else end)]
        if run.job is not None:
            await run.job.settled()
        await self._save(run, events, finished=True)

    async def _save(
        self, run: BackgroundRun, events: list[dict[str, Any]], *, finished: bool = False
    ) -> None:
        """The response as it stands, then a stream's `events`; listeners told."""
        await self.store.put(self.record(run, finished=finished))
        if run.stream:
            await self.store.append_events(run.id, events)
        run.notify()
