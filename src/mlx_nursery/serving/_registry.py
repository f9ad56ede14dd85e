"""The served models, loaded on demand within a memory budget.

A request takes a lease on its model (`ModelRegistry.lease`), which loads the model first
if it is not loaded. Loads run one at a time, in the service's nursery: requests for the
same model wait for the same load, each within its own deadline, and one that gives up
leaves the load going for the others. Before a load, the models already loaded must leave
room for it: at most `--max-loaded-models` of them, and their reservations (weights, KV
budget, prefix cache budget) within `--memory-budget`. The least recently used idle model
is unloaded first; a busy one never (busy: a request holds a lease on it, or a job of it
runs). If there is no room even so, the request gets 503 `insufficient_memory` with
Retry-After: nothing was computed, and room may come when a busy model goes idle.

What a model reserves, and the context it serves, are decided from its files before it
loads (`_reservations.py`): the model list says the same before a load and after.

Each loaded model runs in its own nursery: its engine (thread, lanes, queue, prefix cache)
and its jobs. Unloading closes the engine and waits until its thread has ended (the thread
frees MLX's buffers before it ends), then drops every reference to the model.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Literal

import trio

from ..engine import Engine, SpeechEngine, SynthesisEngine
from ..generation import (
    Conflict,
    OpenAIError,
    RequestTimeout,
    Unavailable,
    unknown_model,
)
from ..models import model_facts, resolve_model_path
from ._job import model_restarting, model_unloaded
from ._metrics import Metrics
from ._model_sources import ModelSource
from ._reservations import MemoryPlan, Reservation, insufficient
from ._slots import AnyHosted, Attempt, ModelSlot, Problem

log = logging.getLogger("mlx_nursery.http")

FailurePolicy = Literal["restart", "exit"]
"""What follows a model's engine thread dying: a new load of the model (at most
`restart_limit` times per model, then as `exit`), or the server's exit with a non-zero
status, for a supervisor (systemd, Kubernetes) to start it again."""


Opener = Callable[[ModelSource, Path, Reservation, trio.Nursery], Awaitable[AnyHosted]]
"""Starts a model's engine in the nursery given and returns it hosted (`Service`)."""


class ModelRegistry:
    """The served models: which are loaded, leases on them, loads and unloads."""

    def __init__(
        self,
        sources: list[ModelSource],
        opener: Opener,
        metrics: Metrics,
        plan: MemoryPlan,
        *,
        on_failure: FailurePolicy = "restart",
        restart_limit: int = 3,
        on_fatal: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.slots = [ModelSlot(source) for source in sources]
        self._by_name = {
            name: slot for slot in self.slots for name in (slot.source.name, *slot.source.aliases)
        }
        self._opener = opener
        self._metrics = metrics
        self.plan = plan
        self._on_failure = on_failure
        self._restart_limit = restart_limit
        self._on_fatal = on_fatal
        """Called once a dead engine is not to be restarted: the server must exit."""
        self._one_load = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._closed = False

    def start(self, nursery: trio.Nursery) -> None:
        """Loads and loaded models run in `nursery` (the service's) from now on."""
        self._nursery = nursery

    async def read_facts(self) -> None:
        """Read each model's config (kind, context length, KV cost) for the model list,
        before any load: the context it will serve within its memory. A model that cannot be
        read now is listed without them; its load says why. Cancellation: between models
        (each read runs on a worker thread)."""
        for slot in self.slots:
            try:
                path = await trio.to_thread.run_sync(_resolve, slot.source)
                slot.facts = await trio.to_thread.run_sync(model_facts, path)
            except Exception:  # noqa: BLE001 - the load reports it, to the request that needs it
                log.warning("model %s: its config could not be read", slot.source.name)
                continue
            with suppress(OpenAIError):  # one that cannot fit: its load says so
                reservation = self.plan.reservation(slot.source.name, slot.facts)
                slot.context = self.plan.served_context(slot.facts, reservation)

    @property
    def only(self) -> ModelSlot | None:
        """The one served model, on a server of one (whose requests need not be read first
        to know their model; a wrong name is refused by its preparation, as ever)."""
        return self.slots[0] if len(self.slots) == 1 else None

    def find(self, name: str) -> ModelSlot:
        """The slot of the model served as `name` (or an alias). Raises the 404."""
        slot = self._by_name.get(name)
        if slot is None:
            raise unknown_model(name, [s.source.name for s in self.slots])
        return slot

    def loaded(self) -> list[AnyHosted]:
        return [slot.hosted for slot in self.slots if slot.hosted is not None]

    def problems(self) -> list[Problem]:
        """What keeps a model from serving now: an engine that died (until its restart
        serves), or a loaded model whose engine does not run. None loaded is healthy: they
        load on demand."""
        found = [slot.problem for slot in self.slots if slot.problem is not None]
        for slot in self.slots:
            hosted = slot.hosted
            ready = slot.state == "ready" and hosted is not None and slot.problem is None
            if ready and hosted is not None and not hosted.engine.healthy:
                detail = _problem(hosted) or "the engine is not running"
                found.append(Problem(slot.source.name, "engine", time.time(), detail))
        return found

    @asynccontextmanager
    async def lease(self, slot: ModelSlot, deadline: float) -> AsyncIterator[AnyHosted]:
        """`slot`'s model, loaded, and kept loaded until the block ends (a job started in
        it keeps the model busy on its own until the job ends).

        Raises 503 `insufficient_memory` when it cannot be loaded for lack of room, 503
        `model_load_failed` when its load failed, 504 when `deadline` passes first (the
        load goes on for whoever else waits for it), 503 after `drain`.

        Cancellation: waiting for the load is cancellable at any point, at no cost to the
        load or to other waiters."""
        slot.leases += 1
        try:
            hosted: AnyHosted | None = None
            with trio.move_on_at(deadline):
                hosted = await self._ready(slot)
            if hosted is None:
                raise RequestTimeout(
                    f"the request timed out while the model {slot.source.name!r} loaded",
                    code="request_timeout",
                )
            slot.last_used = trio.current_time()
            try:
                yield hosted
            finally:
                slot.last_used = trio.current_time()
        finally:
            slot.leases -= 1

    async def load(self, slot: ModelSlot, deadline: float) -> AnyHosted:
        """Load `slot`'s model if it is not (an operator's route; errors as `lease`)."""
        async with self.lease(slot, deadline) as hosted:
            return hosted

    async def unload(self, slot: ModelSlot) -> bool:
        """Unload `slot`'s model and wait until its engine thread has ended; False when it
        was not loaded. Raises 409 while a request holds or uses it, or while it loads.

        Cancellation: once begun, the unload completes whatever happens to the caller
        (shielded: the engine thread ends within a step)."""
        if slot.state in ("unloaded",):
            return False
        if slot.state == "loading" or slot.busy:
            raise Conflict(
                f"the model {slot.source.name!r} is in use; it was not unloaded",
                param="model",
                code="model_busy",
            )
        await self._unload(slot)
        return True

    async def drain(self, grace: float) -> None:
        """No model loads from now on; every loaded model's jobs drain (`Jobs.drain`)."""
        self._closed = True
        async with trio.open_nursery() as nursery:
            for hosted in self.loaded():
                nursery.start_soon(hosted.jobs.drain, grace)

    # -- loading -----------------------------------------------------------------------------
    async def _ready(self, slot: ModelSlot) -> AnyHosted:
        while True:
            if self._closed:
                raise Unavailable("the server is shutting down", code="server_shutting_down")
            if slot.state == "ready":
                assert slot.hosted is not None
                return slot.hosted
            if slot.state == "unloading":
                await slot.ended.wait()
                continue
            if slot.state == "unloaded":
                slot.state, slot.attempt = "loading", Attempt()
                assert self._nursery is not None, "the registry is not started"
                self._nursery.start_soon(self._load, slot, slot.attempt)
            attempt = slot.attempt
            assert attempt is not None
            await attempt.done.wait()
            if attempt.failure is not None:
                raise attempt.failure

    async def _load(self, slot: ModelSlot, attempt: Attempt) -> None:
        name = slot.source.name
        try:
            async with self._one_load:
                if self._closed:
                    raise Unavailable("the server is shutting down", code="server_shutting_down")
                began = trio.current_time()
                path = await trio.to_thread.run_sync(_resolve, slot.source)
                slot.facts = await trio.to_thread.run_sync(model_facts, path)
                reservation = self.plan.reservation(name, slot.facts)
                slot.context = self.plan.served_context(slot.facts, reservation)
                await self._make_room(slot, reservation)
                log.info("loading model %s", name)
                assert self._nursery is not None
                slot.hosted = await self._nursery.start(self._host, slot, path, reservation)
                slot.state = "ready"
                seconds = trio.current_time() - began
                self._loaded(slot, seconds)
        except OpenAIError as exc:
            attempt.failure = exc
        except Exception:
            log.exception("model %s failed to load", name)
            self._metrics.model_load_failures.labels(name).inc()
            attempt.failure = Unavailable(
                f"the model {name!r} failed to load; the server's log says why",
                code="model_load_failed",
            )
        finally:
            if slot.state == "loading":
                slot.state = "unloaded"
                if attempt.failure is None:  # cancelled: the server is stopping
                    attempt.failure = Unavailable(
                        "the server is shutting down", code="server_shutting_down"
                    )
            attempt.done.set()

    def _loaded(self, slot: ModelSlot, seconds: float) -> None:
        """Count a load, and keep the context the model serves for its card once unloaded
        (the same as foretold, unless its KV cost was not what its files said)."""
        hosted, name = slot.hosted, slot.source.name
        assert hosted is not None
        served = hosted.card.context_length
        if slot.context is not None and slot.context != served:
            log.warning(
                "model %s serves a context of %d tokens, not the %d its files foretold",
                name,
                served,
                slot.context,
            )
        slot.context = served or slot.context
        engine = hosted.engine
        self._metrics.model_loaded(
            None if isinstance(engine, (SpeechEngine, SynthesisEngine)) else engine,
            name,
            seconds,
            hosted.reservation.parts(),
        )
        log.info("model %s loaded in %.1f s", name, seconds)

    async def _host(
        self,
        slot: ModelSlot,
        path: Path,
        reservation: Reservation,
        *,
        task_status: trio.TaskStatus[AnyHosted],
    ) -> None:
        """Run the model's engine and jobs in a nursery of their own until it is unloaded
        (or the service ends)."""
        slot.release, slot.ended = trio.Event(), trio.Event()
        died: str | None = None
        try:
            async with trio.open_nursery() as nursery:
                hosted = await self._opener(slot.source, path, reservation, nursery)
                task_status.started(hosted)
                await _first_set(slot.release, hosted.engine.ended)
                if not slot.release.is_set():
                    died = _problem(hosted) or (
                        "the engine thread stopped; the server's log says why"
                    )
                # Before the nursery closes: a request that found the model loaded and
                # starts its job now gets a 503 to retry, not a closed nursery's error.
                hosted.jobs.refuse(model_restarting if died else model_unloaded)
                hosted.engine.close()
        except Exception:  # its jobs contain their own failures: this is the hosting's own
            if not slot.release.is_set():
                log.exception("model %s: its hosting failed", slot.source.name)
                died = "the model's hosting failed; the server's log says why"
        finally:
            slot.hosted = None  # gone before anyone waiting for its end looks again
            if slot.state in ("unloading", "ready"):
                slot.state = "unloaded"
            slot.ended.set()
        if died is not None:
            self._died(slot, died)

    def _died(self, slot: ModelSlot, detail: str) -> None:
        """`slot`'s engine died: report it (/health), then load the model again or, past the
        restart limit or with the `exit` policy, have the server exit."""
        name = slot.source.name
        slot.problem = Problem(name, "engine", time.time(), detail)
        self._metrics.model_unloaded(name)
        if self._closed:
            return
        # The log holds what /health says: a server that exits at once leaves only its log.
        died = f"model {name}: its engine died ({detail})"
        if self._on_failure == "exit" or slot.restarts >= self._restart_limit:
            log.error("%s; the server exits (--on-engine-failure)", died)
            self._on_fatal(f"the engine of model {name!r} died")
            return
        slot.restarts += 1
        log.error("%s; restarting it (%d of %d)", died, slot.restarts, self._restart_limit)
        assert self._nursery is not None
        self._nursery.start_soon(self._restart, slot)

    async def _restart(self, slot: ModelSlot) -> None:
        """Load `slot`'s model again after its engine died; its problem clears once it
        serves. A load that fails leaves the problem reported."""
        try:
            await self._ready(slot)
        except OpenAIError as exc:
            log.error("model %s was not restarted: %s", slot.source.name, exc.message)
            return
        slot.problem = None

    async def _make_room(self, slot: ModelSlot, reservation: Reservation) -> None:
        """Unload idle models, least recently used first, until `reservation` fits beside
        the rest. Raises 503 `insufficient_memory` if busy models leave too little."""
        while True:
            others = [s for s in self.slots if s.hosted is not None and s is not slot]
            held = sum(s.hosted.reservation.total for s in others if s.hosted is not None)
            fits_count = len(others) < self.plan.max_loaded
            budget = self.plan.budget
            fits_bytes = budget is None or held + reservation.total <= budget
            if fits_count and fits_bytes:
                return
            idle = [s for s in others if s.state == "ready" and not s.busy]
            if not idle:
                raise insufficient(
                    f"the model {slot.source.name!r} cannot be loaded now: the models in use "
                    "leave no room for it (--max-loaded-models, --memory-budget)"
                )
            await self._unload(min(idle, key=lambda s: s.last_used))

    async def _unload(self, slot: ModelSlot) -> None:
        name = slot.source.name
        log.info("unloading model %s", name)
        slot.state = "unloading"
        slot.release.set()
        with trio.CancelScope(shield=True):
            await slot.ended.wait()  # the host task has dropped the model (`_host`)
        self._metrics.model_unloaded(name)
        gc.collect()  # the model's arrays held in reference cycles go now, not at some later pass
        log.info("model %s unloaded", name)


async def _first_set(*events: trio.Event) -> None:
    """Wait until any of `events` is set. Cancellation: as any wait."""
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        for event in events:
            nursery.start_soon(wait, event)


def _problem(hosted: AnyHosted) -> str | None:
    """What a text engine says keeps it from serving (its distributed group failed)."""
    return hosted.engine.problem if isinstance(hosted.engine, Engine) else None


def _resolve(source: ModelSource) -> Path:
    """The model's directory: the built-in default's (converted on first use), or the path
    or cached repo id given. Raises ModelNotFoundError. Worker thread."""
    if source.spec is None:
        from ..models.default import ensure_default_model

        return ensure_default_model(log.info)
    return resolve_model_path(source.spec)
