"""The one generation choreography that chat, completions, Responses and Messages plug into:
open (the server takes work), parse, lease the model the request names, fetch its remote
images, prepare on a worker thread, run the generation as a job. Rendering the job's output
is the renderer's (`_rendering.py`); writing it, HTTP's.

An API plugs in with a `Recipe`: how its body parses, which images it names, how it is
prepared for the served model. The HTTP side tells the choreography of its request with a
`Caller`: when it arrived, its deadline, its record and tenant, and how a job is tied to
the request's lifetime. A request that asks to run apart from its request (a background
response) is handed, prepared, to a `Detach` with a `JobStarter`: its job is started by a
task that outlives the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Generic, Protocol, TypeVar, cast

import attrs
import trio

from ..generation import ImageRef, Prepared, ServedModel, parse_json
from ._extensions import Extensions, OutputHook, planned
from ._job import Job
from ._jobs import Jobs
from ._live import LiveRequest
from ._metrics import Metrics
from ._preparation import Preparation
from ._request_log import RequestRecord
from ._service import Service
from ._slots import Hosted

R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)


class Recipe(Generic[R]):
    """What one API plugs into the choreography; `R` is what its preparation makes."""

    lazy: bool = False
    """The body is the request and is parsed only where the choreography must read it before
    preparing (a server of several models; remote images to fetch): the common request
    skips a hop to the worker thread."""
    names_images: bool = False
    """With `lazy`: the request may name remote images (so it is parsed first when the
    server fetches images and the body mentions a URL)."""

    def parse(self, body: Any) -> Any:
        """The API's request from the JSON body (on a worker thread); raises its 400s."""
        return body

    async def resolve(self, request: Any) -> None:
        """What the request refers to that is not in it, before the model is leased (the
        Responses API's previous response). Cancelled with the request."""

    def images(self, request: Any) -> Iterable[ImageRef]:
        """The images the request names (the remote ones are fetched before preparing)."""
        return ()

    def prepare(self, request: Any, served: ServedModel) -> R:
        """The request prepared for `served` (on a worker thread)."""
        raise NotImplementedError

    def plan(self, prepared: R) -> Prepared:
        """What the job runs."""
        assert isinstance(prepared, Prepared)
        return prepared

    def with_plan(self, prepared: R, plan: Prepared) -> R:
        """`prepared` running `plan` instead (the extensions' plan hooks)."""
        assert isinstance(prepared, Prepared)
        return cast(R, plan)


@attrs.frozen
class Caller:
    """The request a generation is for, as the HTTP side knows it."""

    raw: bytes
    arrived: float
    deadline: float
    record: RequestRecord | None
    tenant: str | None
    note: Callable[[Any], None]
    """Told of the prepared request before its job starts (headers about how it was taken)."""
    own: Callable[[Job], Job]
    """Ties the job to the request's lifetime (it ends with the request)."""
    live: LiveRequest | None = None
    """The request's entry among those a client may cancel by id (None: not listed)."""


@attrs.frozen
class JobStarter:
    """A prepared generation's job, to be started by a task that outlives its request."""

    jobs: Jobs
    plan: Prepared
    caller: Caller
    hook: OutputHook | None

    def check(self) -> None:
        """Raise what starting the job would be refused with now (the shutdown 503, a full
        queue's 503), so that the request hears it. Not a checkpoint."""
        self.jobs.check_admission(self.plan, self.caller.tenant)

    async def start(self, registered: Callable[[], None]) -> Job:
        """Start the job (its deadline, record and tenant the request's; not tied to the
        request); returns once it holds a lane. `registered` is called, before the first
        checkpoint, once the job keeps its model busy. Raises and cancels as `Jobs.start`."""
        caller = self.caller
        return await self.jobs.start(
            self.plan,
            caller.deadline,
            caller.arrived,
            caller.record,
            self.hook,
            caller.tenant,
            registered=registered,
        )


class Detach(Protocol[R_contra]):
    """Where a request that runs apart from its request goes, once prepared."""

    def wanted(self, prepared: R_contra) -> bool:
        """Whether `prepared` runs apart from its request."""
        ...

    async def launch(self, prepared: R_contra, starter: JobStarter) -> None:
        """Start `prepared`'s job through `starter` in a task of its own; return once it is
        registered (`JobStarter.start`), while the model is still leased for it. Raises to
        the request what refuses it. Cancellation: cancelled before the job is registered,
        nothing runs; after, the job runs on, apart from the request."""
        ...


class Generations:
    """The choreography, with the parts it runs on."""

    def __init__(
        self,
        service: Service,
        preparation: Preparation,
        extensions: Extensions,
        metrics: Metrics,
        *,
        fetches_images: bool,
    ) -> None:
        self._service = service
        self._preparation = preparation
        self._extensions = extensions
        self._metrics = metrics
        self._fetches_images = fetches_images

    async def start(self, recipe: Recipe[R], caller: Caller) -> tuple[R, Job]:
        """The request prepared and its job started (owned by the caller's request).
        Raises what an extension answers the request with on arrival, the 503 of a server
        not taking work, the request's 4xx, RequestTimeout past the deadline, what leasing
        and starting a job raise, RequestCancelled when a cancel by its id stops it before
        its job runs (it is then the job's to stop: `LiveRequest.hold`). Cancellation:
        nothing is left running but an abandoned preparation thread
        (`Preparation.prepare`)."""
        prepared, job = await self.start_or_detach(recipe, caller, None)
        assert job is not None
        return prepared, job

    async def start_or_detach(
        self, recipe: Recipe[R], caller: Caller, detach: Detach[R] | None
    ) -> tuple[R, Job | None]:
        """As `start`; but a request `detach` wants is launched by it instead, its job not
        tied to the request (the job is None). Raises and cancels as `start`; and what
        `detach.launch` raises."""
        if caller.live is None:
            return await self._start(recipe, caller, detach)
        with caller.live.guard():
            started = await self._start(recipe, caller, detach)
            if started[1] is not None:
                caller.live.hold(started[1])
        return started

    async def _start(
        self, recipe: Recipe[R], caller: Caller, detach: Detach[R] | None
    ) -> tuple[R, Job | None]:
        hook = self._extensions.on_request(self._metrics)
        async with self._prepared(recipe, caller.raw, caller.deadline, True) as (hosted, prepared):
            caller.note(prepared)
            if detach is not None and detach.wanted(prepared):
                starter = JobStarter(hosted.jobs, recipe.plan(prepared), caller, hook)
                await detach.launch(prepared, starter)
                return prepared, None
            job = await hosted.jobs.start(
                recipe.plan(prepared),
                caller.deadline,
                caller.arrived,
                caller.record,
                hook,
                caller.tenant,
            )
            return prepared, caller.own(job)

    async def prepare(self, recipe: Recipe[R], raw: bytes, deadline: float) -> R:
        """The request prepared for the model it names, with nothing run (counting tokens).
        Raises and cancels as `start`."""
        async with self._prepared(recipe, raw, deadline, False) as (_, prepared):
            return prepared

    @asynccontextmanager
    async def _prepared(
        self, recipe: Recipe[R], raw: bytes, deadline: float, to_run: bool
    ) -> AsyncIterator[tuple[Hosted, R]]:
        """The request prepared, its model leased for the block. `to_run`: the extensions'
        fields are taken off the body and their hooks adapt the plan (a request only counted
        takes no field beyond its API's)."""
        models = self._service.check_open()
        extensions = self._extensions if to_run else Extensions()
        body: Any = None
        request: Any = None
        taken: dict[str, Any] = {}
        values: dict[str, object] | None = None
        if not recipe.lazy or (
            models.only is None or (recipe.names_images and self._fetches_images and b"http" in raw)
        ):
            body, request, taken, values = await self._preparation.prepare(
                lambda: self._parse(recipe, raw, extensions), deadline
            )
            await recipe.resolve(request)
        async with self._service.text_model(body, deadline) as (hosted, served):
            images = recipe.images(request) if request is not None else ()
            async with self._preparation.fetched(served, images, deadline) as served:

                def work() -> R:
                    given, parsed, fields = body, request, taken
                    if given is None:  # a lazy recipe's body, parsed on this thread
                        given = parse_json(raw)
                        parsed, fields = extensions.take(given)
                        trio.from_thread.check_cancelled()
                    # parsed where the recipe's request is: a lazy one's, as it prepares
                    found = values if values is not None else extensions.parse(fields)
                    prepared = recipe.prepare(parsed, served)
                    if not to_run or not hosted.plans:
                        return prepared
                    plan = planned(recipe.plan(prepared), hosted.plans, found, given)
                    return recipe.with_plan(prepared, plan)

                prepared = await self._preparation.prepare(work, deadline)
            yield hosted, prepared

    @staticmethod
    def _parse(
        recipe: Recipe[R], raw: bytes, extensions: Extensions
    ) -> tuple[Any, Any, dict[str, Any], dict[str, object] | None]:
        """The body, the recipe's request from it, the extensions' fields as sent, and
        parsed after the request (None: a lazy recipe's, parsed as it prepares)."""
        body = parse_json(raw)
        rest, taken = extensions.take(body)
        request = recipe.parse(rest)
        return body, request, taken, None if recipe.lazy else extensions.parse(taken)
