"""What the routes serve from: the engine, its jobs, the model as the API names it.

The service starts in the app's nursery at startup. The model loads in the
background: until it is ready /health answers 503 and requests get a 503, so
a slow load never trips the ASGI server's startup timeout.

Requests are prepared (JSON parsed, validated, chat template rendered, tokenized) on a
worker thread, one at a time: see `Service.prepare`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar

import trio

from ..engine import Engine, EngineConfig
from ..openai import (
    Grammars,
    ImageLimits,
    Prepared,
    RequestTimeout,
    SegmentEncoder,
    ServedModel,
    Unavailable,
    fetch_images,
    longest_token_bytes,
    tool_format,
    with_processors,
)
from ..settings import Settings
from ..store import responses_store_at
from ._access import AccessPolicy
from ._batching import WritePolicy
from ._jobs import Jobs
from ._metrics import Metrics

log = logging.getLogger("mlx_nursery.http")

State = Literal["loading", "ready", "draining", "failed"]
T = TypeVar("T")

PREPARE_THREADS = 1
"""Requests prepared at once. One: a Hugging Face fast tokenizer is one Rust object, whose
encode holds a shared borrow of it with the GIL released, and transformers resets its
truncation/padding state (a mutable borrow) whenever a call's settings differ from the
current ones; the two at once raise "RuntimeError: Already borrowed"
(huggingface/tokenizers#537). Nothing on our request path changes those settings today, and
one thread at a time rules out two encodes at once (the Trio thread only decodes single
tokens, a shared borrow); and beside the GIL (Jinja rendering is Python) and the engine's
thread, a second preparation would gain little on a small machine. The prompt size
check keeps any one preparation short."""


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
        self.engine: Engine | None = None
        self.served: ServedModel | None = None
        self.jobs: Jobs | None = None
        self.writes = WritePolicy(settings.stream_interval)
        """How streams batch their writes; it counts the streams open."""
        self.store = responses_store_at(
            settings.responses_db_path(),
            max_responses=settings.responses_max,
            max_age_seconds=settings.responses_max_age,
        )
        self._preparing = trio.CapacityLimiter(PREPARE_THREADS)
        self.metrics = Metrics()
        self.access = AccessPolicy(settings)
        """API keys and CORS origins in force (reloaded on SIGHUP: server.py)."""

    def deadline(self) -> float:
        """The deadline of a request that starts now (the request timeout; inf without one)."""
        timeout = self.settings.request_timeout
        return trio.current_time() + timeout if timeout else math.inf

    async def prepare(self, work: Callable[[], T], deadline: float) -> T:
        """Run `work` (a request's parsing, validation, template and tokenizing) on a worker
        thread, so that no request's input stalls the Trio thread: other streams and /health.

        Waits for the one preparation slot (`PREPARE_THREADS`). Raises RequestTimeout past
        `deadline`. Cancellation (a disconnect, the deadline) returns at once and abandons the
        thread: it runs on to its next `trio.from_thread.check_cancelled()` or its end, and
        holds the slot until then, so the tokenizer is never used by two threads at once.
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

    async def fetched(
        self, served: ServedModel, urls: Iterable[tuple[str, str]], deadline: float
    ) -> ServedModel:
        """`served` with the request's allowed remote images fetched (none: `served`).
        Raises RequestTimeout past `deadline`, InvalidRequest for a fetch that fails.
        Cancelled with the request."""
        wanted = list(urls)
        if not wanted or not served.image_limits.domains:
            return served
        with trio.move_on_at(deadline) as scope:
            return served.with_fetched(await fetch_images(wanted, served.image_limits))
        assert scope.cancelled_caught
        raise RequestTimeout(
            f"the request did not complete within {self.settings.request_timeout:g} s",
            code="request_timeout",
        )

    def with_extra_processors(self, prepared: Prepared, body: Any) -> Prepared:
        if self.extra_processors is None:
            return prepared
        return with_processors(prepared, *self.extra_processors(body))

    async def run(self, nursery: trio.Nursery) -> None:
        """Load the model and start the engine in `nursery`; on failure, log, report unhealthy."""
        try:
            await self.store.open()
        except Exception:  # noqa: BLE001 - logged by _failed; the server reports itself unhealthy
            self._failed(f"the responses store at {self.store.path} could not be opened")
            return
        try:
            model = self.settings.model
            if model is None:
                from ..models.default import ensure_default_model

                model = str(await trio.to_thread.run_sync(lambda: ensure_default_model(log.info)))
            config = EngineConfig(
                model,
                max_concurrency=self.settings.max_concurrency,
                max_queue=self.settings.max_queue,
                prompt_cache_bytes=self.settings.prompt_cache_bytes,
                kv_cache_bytes=self.settings.kv_cache_bytes,
                prefill_batch_size=self.settings.prefill_batch_size,
                prefill_step_size=self.settings.prefill_step_size,
                cudnn_attention=self.settings.cudnn_attention,
                warmup=not self.settings.skip_warmup,
            )
            engine: Engine = await nursery.start(Engine(config).run)
        except Exception:  # noqa: BLE001 - logged by _failed; the server reports itself unhealthy
            self._failed("the model failed to load")
            return
        self.engine = engine
        vocab_size, max_token_bytes = await trio.to_thread.run_sync(
            _vocabulary, engine.model.tokenizer
        )
        encoder = await trio.to_thread.run_sync(SegmentEncoder, engine.model.tokenizer)
        if not encoder.enabled:
            log.info("this tokenizer is not split at its added tokens: prompts encode whole")
        self.served = ServedModel(
            name=self.settings.served_model_name or _public_name(self.settings.model),
            aliases=frozenset({self.settings.model or "default", str(engine.model.path)}),
            created=int(time.time()),
            tokenizer=engine.model.tokenizer,
            context_length=engine.model.context_length,
            vocab_size=vocab_size,
            max_token_bytes=max_token_bytes,
            token_bytes=engine.model.token_bytes,
            strict_params=self.settings.strict_params,
            tool_format=tool_format(engine.model.tokenizer),
            grammars=Grammars(engine.model.tokenizer, vocab_size),
            default_max_tokens=self.settings.default_max_tokens,
            vision=engine.model.vision,
            encoder=encoder if encoder.enabled else None,
            image_limits=ImageLimits(
                max_bytes=self.settings.max_image_bytes,
                max_images=self.settings.max_images_per_request,
                max_pixels=self.settings.max_image_pixels,
                local_path=(
                    Path(self.settings.allowed_local_media_path)
                    if self.settings.allowed_local_media_path
                    else None
                ),
                domains=frozenset(
                    d.strip().lower()
                    for d in (self.settings.allowed_media_domains or "").split(",")
                    if d.strip()
                ),
                fetch_timeout=self.settings.image_fetch_timeout,
            ),
        )
        self.metrics.watch_engine(engine, self.served.name)
        self.jobs = Jobs(
            nursery, engine, self.settings.request_timeout, self.metrics, self.served.name
        )
        self.state = "ready"
        self.ready.set()
        log.info(
            "serving %s (context %d tokens, %d lanes)",
            self.served.name,
            self.served.context_length,
            self.settings.max_concurrency,
        )

    def _failed(self, what: str) -> None:
        log.exception("%s", what)
        self.state = "failed"
        self.ready.set()

    @property
    def healthy(self) -> bool:
        return self.state == "ready" and self.engine is not None and self.engine.healthy

    def require_ready(self) -> tuple[Engine, ServedModel, Jobs]:
        if self.state == "draining":
            raise Unavailable("the server is shutting down", code="server_shutting_down")
        if self.state == "loading":
            raise Unavailable("the model is still loading; retry shortly", code="model_loading")
        if not self.healthy or self.engine is None or self.served is None or self.jobs is None:
            raise Unavailable("the engine is not running", code="engine_unavailable")
        return self.engine, self.served, self.jobs

    async def drain(self, grace: float) -> None:
        """Refuse new requests, give running ones `grace` seconds, then cancel them."""
        if self.state == "ready":
            self.state = "draining"
        if self.jobs is not None:
            await self.jobs.drain(grace)


def _vocabulary(tokenizer: Any) -> tuple[int, int]:
    """The vocabulary's size and its longest token in bytes, computed once: `get_vocab()`
    builds a dict of the whole vocabulary. Tokenizing once here also makes transformers'
    one-time reset of the tokenizer's truncation state before any request can overlap it."""
    vocabulary = tokenizer.get_vocab()
    tokenizer.encode("warm up")
    return len(vocabulary), longest_token_bytes(vocabulary)


def _public_name(model: str | None) -> str:
    if model is None:
        from ..models.default import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    return path.name if path.exists() else model
