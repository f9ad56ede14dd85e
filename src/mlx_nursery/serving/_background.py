"""Background responses (the Responses API's `background: true`): a response that runs apart
from the request that made it, stored as it goes, polled, streamed again from any event, and
cancelled by its id.

Its life (decisions/0042):
- The request is prepared as any (its 4xx are the request's), checked against the caps on
  unfinished background responses (server-wide, and per API key: past them, 429) and against
  the engine's queue (full: 503, as for any request). Its job is then registered by a task
  in the service's nursery, not the request's: the model stays busy with it from then on.
  The response is stored `queued` (a stream's `response.created` and `response.queued`
  events with it) and the request answers at once.
- The task waits for a lane as any request (FIFO per key, fair across keys, the request's
  deadline counting), then stores it `in_progress`, renders the job's output through a
  `ResponseBuilder`, stores a stream's events as they are made, and stores its end:
  `completed` / `incomplete`, `cancelled`, or `failed` with the error (the deadline, the
  server's shutdown, the engine). A client that leaves changes nothing.
- `cancel` stops the job (waiting for a lane: nothing was computed; generating: within a
  step) and returns once the end is stored.
- A stream is the stored events past a sequence number, then the live ones until the end:
  the creating request's stream and a resumed one alike.
- Each unfinished row names this process (`StoredResponse.runner`); at startup, what a
  process that is gone left unfinished is stored `failed` (the server restarted), never
  left in progress.

Every task is contained: what it raises fails its response alone, logged, never the nursery.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..generation import InvalidRequest, RateLimited, Unavailable
from ..openai import PreparedResponse, ResponseBuilder, failed_event
from ..store import ResponsesStorage, StoredResponse
from ._background_run import BackgroundRun, BackgroundTask
from ._batching import WritePolicy
from ._failures import internal_error, log_failure
from ._job import Job

if TYPE_CHECKING:  # the choreography imports the service, which holds these
    from ._generations import JobStarter

log = logging.getLogger("mlx_nursery.http")

RESTARTED = "The server restarted before this response finished."
UNFINISHED = ("queued", "in_progress")
_SETTLE_SECONDS = 10.0
"""How long a drain waits, after the jobs' own drain, for the runs to store their ends."""


@attrs.frozen
class BackgroundLimits:
    """Unfinished background responses at once: server-wide, and per API key (with keys)."""

    total: int
    per_key: int


class BackgroundResponses:
    """The background responses this process runs (bounded by `BackgroundLimits`)."""

    def __init__(
        self, store: ResponsesStorage, writes: WritePolicy, limits: BackgroundLimits
    ) -> None:
        self._store = store
        self._task = BackgroundTask(store, writes)
        self._limits = limits
        self._runs: dict[str, BackgroundRun] = {}
        self._nursery: trio.Nursery | None = None
        self._closed = False

    async def open(self, nursery: trio.Nursery) -> None:
        """Store `failed` what processes that are gone left unfinished (logged: a failure
        here leaves them for the next start), then take background responses, their tasks
        in `nursery`. Cancellation: a checkpoint; what was settled stays settled."""
        try:
            for response_id in await self._store.unfinished():
                await self._settle_left(response_id)
        except Exception:
            log.exception("unfinished background responses were not settled")
        self._nursery = nursery

    async def current(self, stored: StoredResponse) -> StoredResponse:
        """`stored`, or, if a process that is gone left it unfinished (a replica that died
        while no process has started since), stored `failed` now: a poll never finds it in
        progress for good. Cancellation: a checkpoint; a settlement begun is stored."""
        if stored.runner is None or stored.runner == self._store.runner:
            return stored
        if stored.id not in await self._store.unfinished():
            return stored  # another live process runs it
        await self._settle_left(stored.id)
        return await self._store.get(stored.id) or stored

    async def start(
        self, prepared: PreparedResponse, owner: str | None, starter: JobStarter
    ) -> dict[str, Any]:
        """Start a background response (module docstring); its body as stored, `queued`.

        Raises 429 past a cap, 503 when the server is shutting down or the engine's queue is
        full, what registering its job raises. Cancellation: cancelled before its job is
        registered, nothing runs; after, the response runs and is stored queued (shielded:
        one store write) whatever happens to the caller."""
        if self._closed or self._nursery is None:
            raise Unavailable("the server is shutting down", code="server_shutting_down")
        self._check_room(owner)
        starter.check()
        run = BackgroundRun(prepared, ResponseBuilder(prepared), owner)
        opening = run.builder.queued()
        body = run.builder.response()
        self._runs[run.id] = run
        await self._nursery.start(self._run, run, starter)
        try:
            with trio.CancelScope(shield=True):
                await self._store.put(self._task.record(run, body))
                if run.stream:
                    await self._store.append_events(run.id, opening)
        except BaseException:
            run.abandoned = True
            run.cancel()
            raise
        finally:
            run.announced.set()
        return body

    async def cancel(self, stored: StoredResponse) -> dict[str, Any]:
        """Cancel a background response; its body once its end is stored. Cancelling a
        cancelled one returns it as it is. Raises the 400s OpenAI answers: a response that
        was not made in the background, or that ended otherwise. Cancellation: the cancel
        stands; the caller stops waiting for the end."""
        if stored.body.get("background") is not True:
            raise InvalidRequest("Cannot cancel a synchronous response.", param="response_id")
        stored = await self.current(stored)
        run = self._runs.get(stored.id)
        if run is not None:
            run.cancel()
            await run.ended.wait()
            stored = await self._store.get(stored.id) or stored
        status = str(stored.body.get("status"))
        if status == "cancelled":
            return stored.body
        if status in UNFINISHED:
            raise InvalidRequest(
                "This response runs in another server process sharing the store; cancel it"
                " through that process.",
                param="response_id",
            )
        article = "an" if status[:1] in "aeiou" else "a"
        raise InvalidRequest(f"Cannot cancel {article} {status} response.", param="response_id")

    async def events(self, response_id: str, after: int) -> AsyncGenerator[list[dict[str, Any]]]:
        """A stream's events numbered past `after`: those stored, then each batch as it is
        stored, until the response ends (a response another process runs: what is stored
        now). Cancellation: a checkpoint between batches; nothing is left behind."""
        while True:
            run = self._runs.get(response_id)
            changed = run.changed if run is not None else None
            found = await self._store.events(response_id, after)
            if found:
                after = int(found[-1]["sequence_number"])
                yield found
            if changed is None:
                return
            await changed.wait()

    async def drain(self) -> None:
        """Start no background response from now on; wait (bounded) for the running ones
        to store their ends, once the models' drain has ended their jobs. Cancellation: stops
        the wait only; the runs end as their jobs do."""
        self._closed = True
        with trio.move_on_after(_SETTLE_SECONDS):
            for run in list(self._runs.values()):
                await run.ended.wait()

    def _check_room(self, owner: str | None) -> None:
        if len(self._runs) >= self._limits.total:
            raise RateLimited(
                f"this server runs at most {self._limits.total} background responses at once"
                " (--max-background); retry once one has ended",
            )
        mine = sum(run.owner == owner for run in self._runs.values())
        if owner is not None and mine >= self._limits.per_key:
            raise RateLimited(
                f"an API key may have at most {self._limits.per_key} background responses"
                " unfinished at once (--max-background-per-key); retry once one has ended",
            )

    # -- the task ------------------------------------------------------------------------------
    async def _run(
        self, run: BackgroundRun, starter: JobStarter, *, task_status: trio.TaskStatus[None]
    ) -> None:
        """A background response's task: its job registered (reported to `start`, which
        hears what refuses it before that), then contained: what it raises after is logged
        and fails this response alone."""
        job: Job | None = None
        try:
            try:
                job, failure = await self._task.admitted(run, starter, task_status)
            except Exception as exc:
                if not run.registered:
                    raise
                log_failure(run.id, "while its background job started", exc)
                failure = internal_error(run.id)
            await self._task.follow(run, job, failure)
        except Exception as exc:
            if not run.registered:
                raise
            log_failure(run.id, "in its background task", exc)  # it fails this response alone
            await self._task.fail(run, job)
        finally:
            del self._runs[run.id]
            run.notify()
            run.ended.set()

    async def _settle_left(self, response_id: str) -> None:
        """Store `failed` a response a process that is gone left unfinished; a stream's
        last event says so."""
        stored = await self._store.get(response_id)
        if stored is None or stored.runner is None:
            return
        body = {
            **stored.body,
            "status": "failed",
            "error": {"code": "server_error", "message": RESTARTED},
        }
        await self._store.put(attrs.evolve(stored, body=body, runner=None))
        told = await self._store.events(response_id, -1)
        if told:
            number = int(told[-1]["sequence_number"]) + 1
            await self._store.append_events(response_id, [failed_event(body, number)])
        log.warning("background response %s was left unfinished: stored failed", response_id)


@attrs.define
class BackgroundLaunch:
    """The Responses route's `Detach`: a request with `background: true` goes to `start`."""

    background: BackgroundResponses
    owner: str | None
    body: dict[str, Any] | None = None
    """The stored body it answers with, once launched."""

    def wanted(self, prepared: PreparedResponse) -> bool:
        return prepared.background

    async def launch(self, prepared: PreparedResponse, starter: JobStarter) -> None:
        """`BackgroundResponses.start`, its body kept; raises and cancels as it does."""
        self.body = await self.background.start(prepared, self.owner, starter)
