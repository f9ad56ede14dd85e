"""The one generation choreography that chat, completions, Responses and Messages plug into:
open (the server takes work), parse, lease the model the request names, fetch its remote
images, prepare on a worker thread, run the generation as a job. Rendering the job's output
is the renderer's (`_rendering.py`); writing it, HTTP's.

An API plugs in with a `Recipe`: how its body parses, which images it names, how it is
prepared for the served model. The HTTP side tells the choreography of its request with a
`Caller`: when it arrived, its deadline, its record and tenant, and how a job is tied to
the request's lifetime.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar, cast

import attrs
import trio

from ..generation import ImageRef, Prepared, ServedModel, parse_json, with_processors
from ._faults import Fault, FaultInjector, injected_failure
from ._job import Job
from ._metrics import Metrics
from ._preparation import Preparation
from ._request_log import RequestRecord
from ._service import Service
from ._slots import Hosted

R = TypeVar("R")

RequestProcessors = Callable[[Any], tuple[Any, ...]]
"""Extra logits processors for a request, given its JSON body. For tests: they make the real
model emit a chosen token script through the real engine and streaming path."""


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
        """`prepared` running `plan` instead (the tests' extra logits processors)."""
        assert isinstance(prepared, Prepared)
        return cast(R, plan)


@attrs.frozen
class Caller:
    """The request a generation is for, as the HTTP side knows it."""

    raw: bytes
    arrived: float
    deadline: float
    fault: Fault | None
    record: RequestRecord | None
    tenant: str | None
    note: Callable[[Any], None]
    """Told of the prepared request before its job starts (headers about how it was taken)."""
    own: Callable[[Job], Job]
    """Ties the job to the request's lifetime (it ends with the request)."""


class Generations:
    """The choreography, with the parts it runs on."""

    def __init__(
        self,
        service: Service,
        preparation: Preparation,
        faults: FaultInjector,
        metrics: Metrics,
        *,
        fetches_images: bool,
        extra_processors: RequestProcessors | None = None,
    ) -> None:
        self._service = service
        self._preparation = preparation
        self._faults = faults
        self._metrics = metrics
        self._fetches_images = fetches_images
        self._extra_processors = extra_processors

    def draw_fault(self) -> Fault | None:
        """This generation request's injected fault (`--fault-rate`), if any; a status fault
        is raised here, before any work. Not a checkpoint."""
        fault = self._faults.draw()
        if fault is None:
            return None
        self._metrics.faults_injected.labels(fault.kind).inc()
        if fault.kind == "status":
            raise injected_failure(fault.value)
        return fault

    async def start(self, recipe: Recipe[R], caller: Caller) -> tuple[R, Job]:
        """The request prepared and its job started (owned by the caller's request).
        Raises the 503 of a server not taking work, the request's 4xx, RequestTimeout past
        the deadline, what leasing and starting a job raise. Cancellation: nothing is left
        running but an abandoned preparation thread (`Preparation.prepare`)."""
        async with self._prepared(recipe, caller.raw, caller.deadline, True) as (hosted, prepared):
            caller.note(prepared)
            job = await hosted.jobs.start(
                recipe.plan(prepared),
                caller.deadline,
                caller.arrived,
                caller.record,
                caller.fault,
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
        """The request prepared (`to_run`: with the tests' extra processors), its model
        leased for the block."""
        models = self._service.check_open()
        body: Any = None
        request: Any = None
        if not recipe.lazy or (
            models.only is None or (recipe.names_images and self._fetches_images and b"http" in raw)
        ):
            body, request = await self._preparation.prepare(
                lambda: self._parse(recipe, raw), deadline
            )
            await recipe.resolve(request)
        async with self._service.text_model(body, deadline) as (hosted, served):
            images = recipe.images(request) if request is not None else ()
            async with self._preparation.fetched(served, images, deadline) as served:

                def work() -> R:
                    given, parsed = body, request
                    if given is None:  # a lazy recipe's body, parsed on this thread
                        given = parsed = parse_json(raw)
                        trio.from_thread.check_cancelled()
                    prepared = recipe.prepare(parsed, served)
                    if not to_run or self._extra_processors is None:
                        return prepared
                    extra = self._extra_processors(given)
                    return recipe.with_plan(
                        prepared, with_processors(recipe.plan(prepared), *extra)
                    )

                prepared = await self._preparation.prepare(work, deadline)
            yield hosted, prepared

    @staticmethod
    def _parse(recipe: Recipe[R], raw: bytes) -> tuple[Any, Any]:
        body = parse_json(raw)
        return body, recipe.parse(body)
