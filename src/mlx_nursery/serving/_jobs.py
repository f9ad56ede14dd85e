"""Generation jobs: compute in its own task, with its own deadline, apart from the response.

Why not generate inside the response body generator: Hypercorn's writes are
shielded, so a client that stays connected but stops reading parks the body
generator at `yield` where no timeout can reach it. The job runs in the
service nursery instead and feeds the response through a small channel; its
deadline (the request timeout, queueing included) and its cancellation
(disconnect, shutdown) work whatever the response is doing.

`Jobs.start` returns once the sequence holds a lane, so admission errors
(queue full, prompt too long, timed out while queued) become plain error
responses, not in-stream errors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial

import attrs
import trio

from ..engine import (
    Engine,
    EngineUnavailable,
    SpeechEvent,
    SynthesisEvent,
)
from ..generation import (
    ClientTooSlow,
    ConnectionDropped,
    Finished,
    GenerationFailed,
    OpenAIError,
    Output,
    Prepared,
    Unavailable,
    engine_errors_as_api_errors,
    generate_text,
    request_cancelled,
    request_timed_out,
)
from ._extensions import OutputHook
from ._failures import internal_error, log_failure
from ._job import Intake, Job, JobItem, JobTask, Started
from ._metrics import Metrics, RequestObserver
from ._request_log import RequestRecord

log = logging.getLogger("mlx_nursery.http")
_BUFFER = math.inf
"""Outputs between the job and the response: unbounded, so that the job ends when its compute
does, not when its client has read it. A job's deadline (the request timeout) bounds the
compute; a reader slower than the model then reads its whole answer, which its own budget
(`max_tokens`, the audio's length) bounds, rather than meet the deadline while blocked on a
full channel and lose the answer already computed. A client that accepts nothing is closed
by the connection's send timeout (`http/_connections.py`)."""


_AudioChannel = trio.MemoryReceiveChannel[SpeechEvent | SynthesisEvent]
AudioEvents = Callable[[], AbstractAsyncContextManager[_AudioChannel]]  # an engine's events


class Jobs:
    def __init__(
        self,
        nursery: trio.Nursery,
        engine: Engine | None,
        timeout: float | None,
        metrics: Metrics | None = None,
        model_name: str = "",
        *,
        share_prefixes: bool = False,
    ) -> None:
        self._nursery = nursery
        self._share_prefixes = share_prefixes
        self._engine = engine
        self._timeout = timeout
        self._metrics = metrics
        self._model_name = model_name
        self._active: set[Job] = set()
        self._idle = trio.Event()
        """Set while no job runs. Replaced only once set: a drain may be waiting on it."""
        self._idle.set()
        self._intake = Intake()
        """Closed by `drain`, refusing by `refuse`: no job starts after either."""

    @property
    def busy(self) -> bool:
        """Whether a job is running (its model must stay loaded)."""
        return bool(self._active)

    async def start(
        self,
        prepared: Prepared,
        deadline: float | None = None,
        arrived: float | None = None,
        record: RequestRecord | None = None,
        hook: OutputHook | None = None,
        tenant: str | None = None,
        registered: Callable[[], None] | None = None,
    ) -> Job:
        """Admit and start a job; returns once its sequence holds a lane.

        `deadline`: when the request started earlier (its preparation); default now plus the
        request timeout. `arrived`: when the request arrived (its latencies count from
        there, in the metrics); default now. `record`: the request's log record, which the
        job fills in (tokens, finish, cancel cause) and holds open until it ends. `hook`: an
        extension's, called with each output first (`_extensions.py`). `tenant`: whose request
        (`_tenancy.py`): the engine shares lanes fairly among tenants, and each tenant's
        prompts are cached apart unless the jobs share prefixes across tenants. `registered`:
        called once the job counts as running (its model busy), before it waits for a lane.

        Raises the OpenAIError of a refused admission: the shutdown 503 once `drain` has
        begun (then without a checkpoint), or when a drain cancels it while queued; 503
        when the queue is full; 400 for a prompt too long; 504 when `deadline` passes while
        queued.

        Cancellation: cancelled before the sequence holds a lane, the job is cancelled with
        it, nothing was admitted, no compute ran, and `Cancelled` propagates. Once `start`
        has returned, the job no longer depends on the caller's scope: its deadline,
        `Job.cancel` (a cancel by the request's id among them: `_live.py`), a drain or the
        end of the request that owns it (`_lifetime.own`) stops it."""
        self._intake.check()
        assert self._engine is not None, "a speech model's jobs are transcriptions"
        if deadline is None:
            deadline = trio.current_time() + (self._timeout if self._timeout else math.inf)
        arrived = trio.current_time() if arrived is None else arrived
        prepared = self._for_tenant(prepared, tenant)
        run = partial(self._run, prepared=prepared, arrived=arrived, record=record, hook=hook)
        return await self._launch(run, deadline, record, registered)

    def check_admission(self, prepared: Prepared, tenant: str | None) -> None:
        """Raise what `start` would be refused with now, before waiting for a lane: the
        shutdown 503, 503 when the queue (or `tenant`'s share) is full. Not a checkpoint."""
        self._intake.check()
        assert self._engine is not None, "a speech model's jobs are transcriptions"
        with engine_errors_as_api_errors(prepared.prompt_param):
            self._engine.check_admission(attrs.evolve(prepared.generation, tenant=tenant))

    def _for_tenant(self, prepared: Prepared, tenant: str | None) -> Prepared:
        """`prepared`, generating for `tenant`: its prefix-cache scope is the tenant's own
        (a cached-token count must not tell one key what another key's prompts held)."""
        if tenant is None:
            return prepared
        generation = prepared.generation
        cache_key = generation.cache_key
        if not self._share_prefixes:
            cache_key = f"{tenant}/{cache_key}" if cache_key is not None else tenant
        generation = attrs.evolve(generation, tenant=tenant, cache_key=cache_key)
        return attrs.evolve(prepared, generation=generation)

    async def _launch(
        self,
        run: JobTask,
        deadline: float,
        record: RequestRecord | None,
        registered: Callable[[], None] | None = None,
    ) -> Job:
        """Admit a job and start `run(job, send)` in the jobs' nursery; returns once it has
        started (holds its lane). A refused start leaves nothing behind: the job is removed
        and the record's part ended with its error. Cancellation: as `start`."""
        self._intake.check()
        send, receive = trio.open_memory_channel[JobItem](_BUFFER)
        job = Job(receive, trio.CancelScope(deadline=deadline))
        self._active.add(job)
        if self._idle.is_set():
            self._idle = trio.Event()
        if record is not None:
            record.model = self._model_name
            record.job_started()
        try:
            if registered is not None:
                registered()
            await self._nursery.start(partial(self._contained, run), job, send, record)
        except BaseException as exc:
            self._finished(job)
            left = isinstance(exc, trio.Cancelled)  # its client left while it waited for a lane
            if left and self._metrics is not None:
                self._metrics.cancelled.labels(self._model_name, "client").inc()
            if record is not None:
                if isinstance(exc, OpenAIError):
                    record.error = exc.code
                elif left:
                    record.cancel_cause = "client"
                record.part_ended()
            raise
        return job

    async def _contained(
        self,
        run: JobTask,
        job: Job,
        send: trio.MemorySendChannel[JobItem],
        record: RequestRecord | None,
        *,
        task_status: trio.TaskStatus[None],
    ) -> None:
        """Run a job's task so that nothing it raises reaches the jobs' nursery (the model's,
        shared by every request on it): an exception before it started is raised by
        `_launch` to its request alone; one after is logged once and becomes the request's
        last item, a 500 `internal_error` naming the request id. Cancellation is not an
        exception here: it ends the task as ever."""
        started = False

        def mark_started(value: None = None) -> None:
            nonlocal started
            started = True
            task_status.started(value)

        try:
            async with send:
                try:
                    await run(job, send, task_status=Started(mark_started))
                except Exception as exc:
                    if not started:
                        raise
                    request_id = record.request_id if record is not None else "-"
                    log_failure(request_id, "inside its job", exc)
                    if record is not None:
                        record.error = "internal_error"
                    with trio.move_on_after(1):  # a client that stopped reading will not see it
                        await send.send(internal_error(request_id))
        finally:
            self._finished(job)
            if record is not None and started:
                record.part_ended()  # before it started, `_launch` ends the record's part

    async def _end(
        self,
        job: Job,
        send: trio.MemorySendChannel[JobItem],
        failure: OpenAIError | None,
        started: bool,
        record: RequestRecord | None,
        observer: RequestObserver | None = None,
    ) -> None:
        """How every job ends once its compute is over: a cancel becomes its error (raised
        before the job started, so that `start` raises it; else sent), and an error is the
        last item sent. Best effort, bounded: a client that stopped reading will not see it
        anyway."""
        if job.scope.cancelled_caught:
            if observer is not None and started:
                observer.cancelled(job.reason)
            if record is not None:
                record.cancel_cause = job.reason
            failure = self._cancellation_error(job, record)
            if not started:
                raise failure
        if isinstance(failure, ClientTooSlow):  # the client's doing, as a disconnect
            if observer is not None:
                observer.cancelled("client")
            if record is not None:
                record.cancel_cause = "client"
        if failure is not None:
            if record is not None:
                record.error = failure.code
            with trio.move_on_after(1):
                await send.send(failure)

    async def _run(
        self,
        job: Job,
        send: trio.MemorySendChannel[JobItem],
        *,
        prepared: Prepared,
        arrived: float,
        record: RequestRecord | None,
        hook: OutputHook | None,
        task_status: trio.TaskStatus[None],
    ) -> None:
        started = False
        observer = self._metrics.observer(self._model_name, arrived) if self._metrics else None

        def observe(output: Output) -> None:
            if hook is not None:  # what it raises leaves the generation: its compute stops
                hook(output)
            now = trio.current_time()
            if isinstance(output, Finished):
                usage = output.usage
                if observer is not None:
                    observer.finished(
                        now, output.reason, usage.prompt_tokens, usage.completion_tokens
                    )
                if record is not None:
                    record.prompt_tokens = usage.prompt_tokens
                    record.completion_tokens = usage.completion_tokens
                    record.finish_reason = output.reason
            else:
                if observer is not None:
                    observer.first_token(now)
                if record is not None and record.ttft_s is None:
                    record.ttft_s = now - arrived

        def mark_started(value: None = None) -> None:
            nonlocal started
            started = True
            task_status.started(value)

        failure: OpenAIError | None = None
        with job.scope:
            try:
                assert self._engine is not None
                await generate_text(
                    self._engine,
                    prepared.generation,
                    prepared.stops,
                    send,
                    prompt_param=prepared.prompt_param,
                    tools=prepared.tool_extractor(),
                    logprobs=prepared.logprob_aligner(),
                    reasoning=prepared.reasoning_splitter(),
                    observe=observe if observer or record or hook else None,
                    usage=prepared.usage,
                    task_status=Started(mark_started),
                )
            except OpenAIError as exc:
                if not started:
                    raise
                failure = exc
                drops = prepared.drop_on_failure or isinstance(exc, ConnectionDropped)
                if drops and prepared.stream:  # an extension's cut (`_extensions.py`)
                    failure = ConnectionDropped(
                        "the stream's connection is cut on purpose", code="connection_dropped"
                    )
        await self._end(job, send, failure, started, record, observer)

    async def start_audio(
        self, events: AudioEvents, code: str, deadline: float, record: RequestRecord | None
    ) -> Job:
        """Admit and start a transcription or synthesis: `events` opens it on its engine
        (`partial(engine.synthesize, request)`), `code` names its failure. Returns once it
        holds the lane. Raises as `start` does (shutdown, queue full, deadline while queued).
        Cancellation: as `start`."""
        run = partial(self._audio, events=events, code=code, record=record)
        return await self._launch(run, deadline, record)

    async def _audio(
        self,
        job: Job,
        send: trio.MemorySendChannel[JobItem],
        *,
        events: AudioEvents,
        code: str,
        record: RequestRecord | None,
        task_status: trio.TaskStatus[None],
    ) -> None:
        """A transcription's or synthesis's task: its engine's events into `send`; the error
        that ends it early (deadline, shutdown, failure) as the last item once it started."""
        started = False
        failure: OpenAIError | None = None
        with job.scope, engine_errors_as_api_errors():
            async with events() as received:
                started = True
                task_status.started()
                async for event in received:
                    if isinstance(event, EngineUnavailable):
                        failure = GenerationFailed(str(event), code=code)
                        break
                    await send.send(event)
        await self._end(job, send, failure, started, record)

    def _cancellation_error(self, job: Job, record: RequestRecord | None) -> OpenAIError:
        if job.reason == "cancel":
            return request_cancelled(record.request_id if record is not None else "-")
        if job.reason == "shutdown":
            return Unavailable(
                "the server is shutting down; the request was cancelled",
                code="server_shutting_down",
            )
        if job.reason == "timeout":
            return request_timed_out(self._timeout or 0)
        return Unavailable("the request was cancelled", code="cancelled")

    def _finished(self, job: Job) -> None:
        job.ended.set()
        self._active.discard(job)
        if not self._active:
            self._idle.set()

    def refuse(self, error: Callable[[], OpenAIError]) -> None:
        """Refuse every later start with `error()`: the model's engine died or it is being
        unloaded, and its jobs' nursery is about to close. Not a checkpoint."""
        self._intake.refusal = error

    async def settled(self) -> None:
        """Wait until no job runs. Cancellation: stops the wait only."""
        await self._idle.wait()

    async def drain(self, grace: float) -> None:
        """Refuse new jobs from now on (`start` raises the shutdown error), let running jobs
        finish for up to `grace` seconds, then cancel the rest; returns without waiting for
        them to end."""
        self._intake.closed = True
        with trio.move_on_after(grace):
            await self._idle.wait()
        for job in list(self._active):
            job.cancel("shutdown")
