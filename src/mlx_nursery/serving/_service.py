"""The served models' lifetime: the store opened, the registry started, the models to
preload loaded, the state /health reports, the drain at shutdown.

The service starts in the app's nursery at startup. The models to preload (a server of one
model: that one) load in the background: until they are ready /health answers 503 and
requests get a 503, so a slow load never trips the ASGI server's startup timeout. Other
models load when a request names them (`_registry.py`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import trio

from ..engine import Engine, default_memory_budget
from ..generation import InvalidRequest, OpenAIError, ServedModel, Unavailable, requested_model
from ..settings import Settings
from ..store import ResponsesStorage
from ._adapters import LoraAdapters
from ._background import BackgroundResponses
from ._metrics import Metrics
from ._model_sources import ModelSource
from ._registry import ModelRegistry, Opener
from ._reservations import MemoryPlan
from ._slots import Hosted, ModelSlot, Problem, generating

log = logging.getLogger("mlx_nursery.http")

State = Literal["loading", "ready", "draining", "failed"]


class Service:
    """The registry of served models and the server's state, from startup to the drain."""

    def __init__(
        self,
        settings: Settings,
        sources: list[ModelSource],
        opener: Opener,
        metrics: Metrics,
        store: ResponsesStorage,
        background: BackgroundResponses,
        adapters: LoraAdapters | None = None,
    ) -> None:
        self.settings = settings
        self.adapters = adapters or LoraAdapters(enabled=False)
        """The LoRA adapters served on the one text model (`_adapters.py`)."""
        self.sources = sources
        self._opener = opener
        self._metrics = metrics
        self._store = store
        self._background = background
        self.state: State = "loading"
        self.ready = trio.Event()
        """Set once the state leaves "loading" (to ready, or failed)."""
        self.stopped_by_failure = trio.Event()
        """Set when a shared part failed for good: the server is to exit non-zero."""
        self.failure: Problem | None = None
        self.preload = settings.preload or (
            (self.sources[0].name,) if len(self.sources) == 1 else ()
        )
        """Loaded at startup: those named, else the only model of a server of one."""
        self.models: ModelRegistry | None = None
        """Made at startup (`run`), once the memory budget is known."""

    async def run(self, nursery: trio.Nursery) -> None:
        """Open the store (and settle the background responses a process that is gone left
        unfinished; theirs run in `nursery`), start the model registry in `nursery` and load
        the models to preload; on failure, log and report unhealthy (the server then exits:
        server.py)."""
        try:
            await self._store.open()
        except Exception:  # noqa: BLE001 - logged by _failed; the server reports itself unhealthy
            self._failed(f"the responses store at {self._store.path} could not be opened")
            return
        await self._background.open(nursery)
        budget = self.settings.memory_budget
        if budget is None:
            budget = await trio.to_thread.run_sync(default_memory_budget)
        plan = MemoryPlan(
            max_loaded=self.settings.max_loaded_models,
            budget=budget,
            kv_cache_bytes=self.settings.kv_cache_bytes,
            prompt_cache_bytes=self.settings.prompt_cache_bytes,
            max_concurrency=self.settings.max_concurrency,
            kv_bits=self.settings.kv_bits,
            kv_group_size=self.settings.kv_group_size,
        )
        self.models = ModelRegistry(
            self.sources,
            self._opener,
            self._metrics,
            plan,
            on_failure=self.settings.on_engine_failure,  # type: ignore[arg-type]  # validated
            restart_limit=self.settings.engine_restarts,
            on_fatal=self._fatal,
        )
        self.models.start(nursery)
        await self.models.read_facts()
        for name in self.preload:
            try:
                await self.models.load(self.models.find(name), math.inf)
            except OpenAIError as exc:
                log.error("model %s was not preloaded: %s", name, exc.message)
                self.state = "failed"
                self.ready.set()
                return
        self.state = "ready"
        self.ready.set()
        log.info(
            "serving %s (%s loaded, %d lanes per model)",
            ", ".join(slot.source.name for slot in self.models.slots),
            ", ".join(self.preload) or "none",
            self.settings.max_concurrency,
        )

    def _failed(self, what: str) -> None:
        log.exception("%s", what)
        self.state = "failed"
        self.ready.set()

    def _fatal(self, reason: str) -> None:
        """A shared part failed for good (an engine past its restarts): report unhealthy and
        have the server exit non-zero (`server.py` waits for `stopped_by_failure`)."""
        self.failure = Problem("*", "server", time.time(), reason)
        if self.state != "draining":
            self.state = "failed"
        self.stopped_by_failure.set()

    def problems(self) -> list[Problem]:
        """What keeps the server from serving now (empty: healthy), for /health."""
        found = [self.failure] if self.failure is not None else []
        if self.models is not None:
            found += self.models.problems()
        return found

    def check_open(self) -> ModelRegistry:
        """The registry, while the server takes requests. Raises the 503 otherwise."""
        if self.state == "draining":
            raise Unavailable("the server is shutting down", code="server_shutting_down")
        if self.state == "loading" or self.models is None:
            raise Unavailable("the model is still loading; retry shortly", code="model_loading")
        if self.state == "failed":
            raise Unavailable("the server failed to start", code="engine_unavailable")
        return self.models

    def listing(self) -> ModelRegistry:
        """The registry for /v1/models: as `check_open`, but while the models load too (what
        is served is known from the start; a UI that lists models at its own start should
        not take a loading server for an empty or broken one). Raises the 503 otherwise."""
        if self.state == "loading" and self.models is not None:
            return self.models
        return self.check_open()

    @asynccontextmanager
    async def text_model(
        self, body: Any | None, deadline: float
    ) -> AsyncIterator[tuple[Hosted, ServedModel]]:
        """The text-generation model a request names (`slot_for`), leased until the block
        ends: its hosting and the model as the text APIs present it. Raises the 400 for a
        model of another kind before anything loads for it, and what `ModelRegistry.lease`
        raises. Cancellation: as `lease`."""
        slot = self.slot_for(body).expect("generation")
        async with self.check_open().lease(slot, deadline) as leased:
            hosted = generating(leased)
            yield hosted, hosted.text_model(slot.source.name)

    async def load_adapter(self, name: str, path: Path, deadline: float) -> None:
        """Load the LoRA adapter at `path` on the server's one model (loading the model first
        if it must, within `deadline`) and serve it as `name`. Raises 400 where adapters are
        not enabled, and what `LoraAdapters.load` and `ModelRegistry.lease` raise.
        Cancellation: a caller that leaves during the adapter's load leaves it loaded or
        not as the engine thread ends it; it is served only once loaded."""
        slot, models = self._adapters_base()
        async with models.lease(slot, deadline) as hosted:
            engine = hosted.engine
            if not isinstance(engine, Engine):
                raise InvalidRequest("the model serves no adapters", code="invalid_adapter")
            budget = models.plan.budget
            held = sum(h.reservation.total for h in models.loaded())
            room = None if budget is None else budget - held
            await self.adapters.load(slot, engine, name, path, room)
            self._metrics.adapters_reserved(slot.source.name, sum(engine.adapters.values()))

    async def unload_adapter(self, name: str) -> None:
        """Stop serving the LoRA adapter `name`, freeing it on the loaded model. Raises 404
        for one not served, 409 while a request of it runs. Cancellation: as
        `LoraAdapters.unload`."""
        slot, _ = self._adapters_base()
        hosted = slot.hosted
        engine = hosted.engine if hosted is not None and slot.state == "ready" else None
        engine = engine if isinstance(engine, Engine) else None
        await self.adapters.unload(slot, engine, name)
        if engine is not None:
            self._metrics.adapters_reserved(slot.source.name, sum(engine.adapters.values()))

    def _adapters_base(self) -> tuple[ModelSlot, ModelRegistry]:
        """The model adapters attach to, and the registry. 400 where adapters are off."""
        models = self.check_open()
        if not self.adapters.enabled or models.only is None:
            raise InvalidRequest(
                "LoRA adapters are not enabled on this server (--enable-lora or --lora)",
                code="lora_not_enabled",
            )
        return models.only, models

    def slot_for(self, body: Any | None) -> ModelSlot:
        """The slot of the model a request names: on a server of one model, that one
        (`body` unread: its preparation refuses a wrong name); else the one `body` names."""
        models = self.check_open()
        only = models.only
        if only is not None:
            return only
        return models.find(requested_model(body))

    async def end_grace(self) -> None:
        """During a drain: cancel the requests still running now, as the grace's end would.
        Cancellation: a checkpoint."""
        if self.models is not None:
            await self.models.drain(0)

    async def settled(self, limit: float) -> None:
        """Wait, for up to `limit` seconds, until no request's job runs (after a drain: the
        cancelled ones have decided their final answers). Cancellation: stops the wait."""
        if self.models is not None:
            with trio.move_on_after(limit):
                for hosted in self.models.loaded():
                    await hosted.jobs.settled()

    async def drain(self, grace: float) -> None:
        """Refuse new requests, give running ones (background responses too) `grace`
        seconds, then cancel them; return once the background responses stored their ends
        (bounded)."""
        if self.state in ("ready", "loading"):
            self.state = "draining"
        if self.models is not None:
            await self.models.drain(grace)
        await self._background.drain()
