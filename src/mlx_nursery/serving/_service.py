"""What the routes serve from: the served models (their engines and jobs), the store.

The service starts in the app's nursery at startup. The models to preload (a server of one
model: that one) load in the background: until they are ready /health answers 503 and
requests get a 503, so a slow load never trips the ASGI server's startup timeout. Other
models load when a request names them (`_registry.py`).

Requests are prepared (JSON parsed, validated, chat template rendered, tokenized, media
decoded) on worker threads, a few at a time: see `Service.prepare`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import trio

from ..engine import (
    Embedder,
    EmbedderConfig,
    Engine,
    EngineConfig,
    SpeechConfig,
    SpeechEngine,
    default_memory_budget,
)
from ..models import model_facts
from ..openai import (
    AudioLimits,
    Grammars,
    ImageLimits,
    ImageRef,
    MediaFetches,
    ModelCard,
    OpenAIError,
    Prepared,
    RequestCaps,
    RequestTimeout,
    ScriptSpec,
    SegmentEncoder,
    ServedEmbedder,
    ServedModel,
    Unavailable,
    check_before_fetching,
    fetch_images,
    longest_token_bytes,
    parse_media_hosts,
    parse_script,
    requested_model,
    thinking_format,
    tool_format,
    with_processors,
)
from ..settings import Settings, SettingsError
from ..store import responses_store_at
from ._batching import WritePolicy
from ._embedding_calls import EmbeddingCalls
from ._faults import Fault, FaultInjector, injected_failure, parse_fault
from ._jobs import Jobs
from ._metrics import Metrics
from ._model_sources import ModelSource, model_sources
from ._registry import (
    AnyHosted,
    Hosted,
    HostedEmbedder,
    ModelRegistry,
    ModelSlot,
    Problem,
    generating,
)
from ._reservations import MemoryPlan, Reservation, held

log = logging.getLogger("mlx_nursery.http")

State = Literal["loading", "ready", "draining", "failed"]
T = TypeVar("T")

PREPARE_THREADS = 4
"""Requests prepared at once, each on a thread of its own, so one slow preparation (a
request's images or audio decoded within its limits) holds one thread, not every request's
way in. What they share is thread-safe: the tokenizer (a Hugging Face fast tokenizer is one
Rust object; concurrent encodes are shared borrows, and nothing on our path changes its
truncation or padding, whose reset would be the mutable borrow that fails with "Already
borrowed", huggingface/tokenizers#537: `_vocabulary`'s warm-up absorbs the one-time reset),
the segment cache (a lock), the VLM processor (a lock). Why four, and what one cost:
docs/architecture.md ("Preparation")."""


RequestProcessors = Callable[[Any], tuple[Any, ...]]
"""Extra logits processors for a request, given its JSON body. For tests: they make the real
model emit a chosen token script through the real engine and streaming path."""


class Service:
    def __init__(
        self, settings: Settings, extra_processors: RequestProcessors | None = None
    ) -> None:
        self.settings = settings
        self.extra_processors = extra_processors
        self.state: State = "loading"
        self.ready = trio.Event()
        """Set once the state leaves "loading" (to ready, or failed)."""
        self.stopped_by_failure = trio.Event()
        """Set when a shared part failed for good: the server is to exit non-zero."""
        self.failure: Problem | None = None
        self.sources = model_sources(settings)
        self.default_script = default_script(settings)
        """The scripted model's script for requests without one (`--script`)."""
        self.preload = settings.preload or (
            (self.sources[0].name,) if len(self.sources) == 1 else ()
        )
        """Loaded at startup: those named, else the only model of a server of one."""
        self.models: ModelRegistry | None = None
        """Made at startup (`run`), once the memory budget is known."""
        self.image_limits = image_limits(settings)
        self.audio_limits = AudioLimits(
            max_bytes=settings.max_audio_bytes, max_seconds=settings.max_audio_seconds
        )
        self.writes = WritePolicy(settings.stream_interval)
        """How streams batch their writes; it counts the streams open."""
        self.store = responses_store_at(settings.responses_db_path(), settings.responses_limits())
        self._preparing = trio.CapacityLimiter(PREPARE_THREADS)
        self.fetches = MediaFetches(settings.max_image_fetches, settings.max_fetched_image_bytes)
        """The server's image fetches: how many at once, the bytes they hold."""
        self.metrics = Metrics()
        self.faults = FaultInjector(
            settings.fault_rate, parse_fault(settings.fault), settings.fault_seed
        )
        """Server-wide fault injection (`--fault-rate`): off by default."""

    def deadline(self) -> float:
        """The deadline of a request that starts now (the request timeout; inf without one)."""
        timeout = self.settings.request_timeout
        return trio.current_time() + timeout if timeout else math.inf

    async def prepare(self, work: Callable[[], T], deadline: float) -> T:
        """Run `work` (a request's parsing, validation, template, tokenizing, media decoding)
        on a worker thread, so that no request's input stalls the Trio thread: other streams
        and /health.

        Waits (FIFO) for one of the `PREPARE_THREADS` slots. Raises RequestTimeout past
        `deadline`. Cancellation (a disconnect, the deadline) returns at once and abandons the
        thread: it runs on to its next check (`openai._checkpoint`: before each costly step)
        or its end, and holds its slot until then.
        """
        with trio.move_on_at(deadline) as scope:
            return await trio.to_thread.run_sync(
                work, limiter=self._preparing, abandon_on_cancel=True
            )
        assert scope.cancelled_caught
        raise RequestTimeout(
            f"the request did not complete within {self.settings.request_timeout:g} s",
            code="request_timeout",
        )

    @asynccontextmanager
    async def fetched(
        self, served: ServedModel, images: Iterable[ImageRef], deadline: float
    ) -> AsyncIterator[ServedModel]:
        """`served` with the request's remote images fetched, for the block (prepare the
        request in it: the fetched bytes count against the server's limit until it ends).
        With remote images to fetch, the request's images are first checked as its
        preparation would check them (`check_before_fetching`). Raises RequestTimeout past
        `deadline`, InvalidRequest for images refused or a fetch that fails, Overloaded past
        the server's fetched bytes. Cancelled with the request."""
        limits = served.image_limits
        wanted = list(images)
        if not limits.hosts or not any(image.remote for image in wanted):
            yield served
            return
        check_before_fetching(wanted, limits, served.vision is not None)
        hold = self.fetches.hold()
        try:
            with trio.move_on_at(deadline) as scope:
                fetched = await fetch_images(wanted, limits, hold)
            if scope.cancelled_caught:
                raise RequestTimeout(
                    f"the request did not complete within {self.settings.request_timeout:g} s",
                    code="request_timeout",
                )
            yield served.with_fetched(fetched)
        finally:
            hold.release()

    @property
    def preparing(self) -> int:
        """Preparation threads busy now, abandoned ones included (tests, statistics)."""
        return int(self._preparing.borrowed_tokens)

    def draw_fault(self) -> Fault | None:
        """This generation request's injected fault (`--fault-rate`), if any; a status fault
        is raised here, before any work. Not a checkpoint."""
        fault = self.faults.draw()
        if fault is None:
            return None
        self.metrics.faults_injected.labels(fault.kind).inc()
        if fault.kind == "status":
            raise injected_failure(fault.value)
        return fault

    def with_extra_processors(self, prepared: Prepared, body: Any) -> Prepared:
        if self.extra_processors is None:
            return prepared
        return with_processors(prepared, *self.extra_processors(body))

    async def run(self, nursery: trio.Nursery) -> None:
        """Open the store, start the model registry in `nursery` and load the models to
        preload; on failure, log and report unhealthy (the server then exits: server.py)."""
        try:
            await self.store.open()
        except Exception:  # noqa: BLE001 - logged by _failed; the server reports itself unhealthy
            self._failed(f"the responses store at {self.store.path} could not be opened")
            return
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
            self._open_model,
            self.metrics,
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

    async def _open_model(
        self, source: ModelSource, path: Path, reservation: Reservation, nursery: trio.Nursery
    ) -> AnyHosted:
        """Start `source`'s engine in `nursery` (its own) and present it to the API (the
        registry's `Opener`). Raises what the load raised."""
        facts = await trio.to_thread.run_sync(model_facts, path)
        if facts.kind == "embedding":
            return await self._open_embedder(source, path, reservation, nursery)
        if facts.kind == "stt":
            return await self._open_speech_model(source, path, reservation, nursery)
        config = EngineConfig(
            path,
            max_concurrency=self.settings.max_concurrency,
            max_queue=self.settings.max_queue,
            max_queue_per_tenant=self.settings.max_queue_per_key,
            prompt_cache_bytes=reservation.prefix_cache,
            kv_cache_bytes=reservation.kv,
            prefill_batch_size=self.settings.prefill_batch_size,
            prefill_step_size=self.settings.prefill_step_size,
            prefill_chunk_ms=self.settings.prefill_chunk_ms,
            cudnn_attention=self.settings.cudnn_attention,
            kv_bits=self.settings.kv_bits,
            kv_group_size=self.settings.kv_group_size,
            warmup=not self.settings.skip_warmup,
        )
        engine: Engine = await nursery.start(Engine(config).run)
        token_ids, max_token_bytes = await trio.to_thread.run_sync(
            _vocabulary, engine.model.tokenizer
        )
        vocab_size = engine.model.vocab_size
        encoder = await trio.to_thread.run_sync(SegmentEncoder, engine.model.tokenizer)
        if not encoder.enabled:
            log.info("this tokenizer is not split at its added tokens: prompts encode whole")
        served = ServedModel(
            name=source.name,
            aliases=source.aliases,  # never its directory: a path is no model's name
            created=int(time.time()),
            tokenizer=engine.model.tokenizer,
            context_length=engine.model.context_length,
            vocab_size=vocab_size,
            max_token_bytes=max_token_bytes,
            token_bytes=engine.model.token_bytes,
            strict_params=self.settings.strict_params,
            tool_format=tool_format(engine.model.tokenizer),
            grammars=Grammars(engine.model.tokenizer, max(vocab_size, token_ids)),
            thinking=thinking_format(engine.model.tokenizer),
            default_max_tokens=self.settings.default_max_tokens,
            vision=engine.model.vision,
            encoder=encoder if encoder.enabled else None,
            image_limits=self.image_limits,
            caps=RequestCaps(
                max_messages=self.settings.max_messages,
                max_tools=self.settings.max_tools,
                max_tokens=self.settings.max_tokens_ceiling,
            ),
            scripted=engine.model.scripted,
            default_script=self.default_script if engine.model.scripted else None,
        )
        jobs = Jobs(
            nursery,
            engine,
            self.settings.request_timeout,
            self.metrics,
            source.name,
            share_prefixes=self.settings.shared_prefix_cache,
        )
        kept = held(reservation, engine.model, prefix_cache=not engine.model.scripted)
        return Hosted(engine, served, jobs, kept, served.card())

    async def _open_speech_model(
        self, source: ModelSource, path: Path, reservation: Reservation, nursery: trio.Nursery
    ) -> Hosted:
        """A Whisper: its speech engine (thread, lane, queue) in `nursery`; transcriptions
        only. Raises what the load raised."""
        config = SpeechConfig(path, max_queue=self.settings.max_queue)
        engine: SpeechEngine = await nursery.start(SpeechEngine(config).run)
        card = ModelCard(
            id=source.name,
            created=int(time.time()),
            context_length=0,
            input_modalities=["audio"],
            kind="speech",
        )
        jobs = Jobs(nursery, None, self.settings.request_timeout, self.metrics, source.name)
        return Hosted(engine, None, jobs, reservation, card)

    async def _open_embedder(
        self, source: ModelSource, path: Path, reservation: Reservation, nursery: trio.Nursery
    ) -> HostedEmbedder:
        """An embedding model's engine (its own thread, as any model's), started in `nursery`."""
        config = EmbedderConfig(
            path,
            max_concurrency=self.settings.max_concurrency,
            max_queue=self.settings.max_queue,
            max_batch_inputs=self.settings.embedding_batch_size,
            max_batch_tokens=self.settings.embedding_batch_tokens,
        )
        embedder: Embedder = await nursery.start(Embedder(config).run)
        model = embedder.model
        _, max_token_bytes = await trio.to_thread.run_sync(_vocabulary, model.tokenizer)
        served = ServedEmbedder(
            name=source.name,
            aliases=source.aliases,
            created=int(time.time()),
            tokenizer=model.tokenizer,
            context_length=model.spec.context_length,
            vocab_size=model.spec.vocab_size,
            dimensions=model.spec.dimensions,
            matryoshka=model.spec.matryoshka,
            max_token_bytes=max_token_bytes,
        )
        calls = EmbeddingCalls(embedder, self.settings.request_timeout, self.metrics, source.name)
        return HostedEmbedder(embedder, served, calls, reservation)

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

    @property
    def healthy(self) -> bool:
        return self.state == "ready" and not self.problems()

    def check_open(self) -> ModelRegistry:
        """The registry, while the server takes requests. Raises the 503 otherwise."""
        if self.state == "draining":
            raise Unavailable("the server is shutting down", code="server_shutting_down")
        if self.state == "loading" or self.models is None:
            raise Unavailable("the model is still loading; retry shortly", code="model_loading")
        if self.state == "failed":
            raise Unavailable("the server failed to start", code="engine_unavailable")
        return self.models

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

    def slot_for(self, body: Any | None) -> ModelSlot:
        """The slot of the model a request names: on a server of one model, that one
        (`body` unread: its preparation refuses a wrong name); else the one `body` names."""
        models = self.check_open()
        only = models.only
        if only is not None:
            return only
        return models.find(requested_model(body))

    @property
    def hosted(self) -> Hosted | None:
        """The first loaded generation model (tests and a server of one model)."""
        loaded = self.models.loaded() if self.models is not None else []
        return next((h for h in loaded if isinstance(h, Hosted)), None)

    @property
    def engine(self) -> Engine | None:
        """The first loaded model's text engine (None: none loaded, or a speech model)."""
        engine = self.hosted.engine if self.hosted is not None else None
        return engine if isinstance(engine, Engine) else None

    @property
    def served(self) -> ServedModel | None:
        return self.hosted.served if self.hosted is not None else None

    @property
    def jobs(self) -> Jobs | None:
        return self.hosted.jobs if self.hosted is not None else None

    async def drain(self, grace: float) -> None:
        """Refuse new requests, give running ones `grace` seconds, then cancel them."""
        if self.state in ("ready", "loading"):
            self.state = "draining"
        if self.models is not None:
            await self.models.drain(grace)


def _vocabulary(tokenizer: Any) -> tuple[int, int]:
    """The ids the tokenizer spans (its last id + 1: a vocabulary may have holes) and its
    longest token in bytes, computed once: `get_vocab()` builds a dict of the whole
    vocabulary. Tokenizing once here also makes transformers' one-time reset of the
    tokenizer's truncation state before any request can overlap it."""
    vocabulary = tokenizer.get_vocab()
    tokenizer.encode("warm up")
    return max(vocabulary.values(), default=-1) + 1, longest_token_bytes(vocabulary)


def default_script(settings: Settings) -> ScriptSpec | None:
    """The script in `--script`'s file (None without one). Raises SettingsError for a file
    that cannot be read or is not a valid script. Reads a file: startup only."""
    if settings.script is None:
        return None
    path = Path(settings.script).expanduser()
    try:
        value = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise SettingsError(f"--script {path}: {exc}") from None
    try:
        return parse_script(value, "--script")
    except OpenAIError as exc:
        where = f" (at {exc.param})" if exc.param and exc.param not in exc.message else ""
        raise SettingsError(f"--script {path}: {exc.message}{where}") from None


def image_limits(settings: Settings) -> ImageLimits:
    """The image limits of every vision model served, from the settings."""
    return ImageLimits(
        max_bytes=settings.max_image_bytes,
        max_images=settings.max_images_per_request,
        max_pixels=settings.max_image_pixels,
        max_request_pixels=settings.max_image_pixels_per_request,
        local_path=(
            Path(settings.allowed_local_media_path) if settings.allowed_local_media_path else None
        ),
        hosts=parse_media_hosts(settings.allowed_media_domains),
        allow_private=settings.allow_private_media_addresses,
        fetch_timeout=settings.image_fetch_timeout,
    )
