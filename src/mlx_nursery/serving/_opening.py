"""Opening a model: its engine started (text, embedding or cross-encoder, or speech, by what
its files say it is) and presented to the APIs (`ServedModel`, `ServedEmbedder`, a speech
card), with its jobs.
The model registry (`_registry.py`) calls the opener when a model is to load."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from ..engine import (
    Embedder,
    EmbedderConfig,
    Engine,
    EngineConfig,
    SpeechConfig,
    SpeechEngine,
    SynthesisConfig,
    SynthesisEngine,
)
from ..generation import (
    Grammars,
    ImageLimits,
    ModelCard,
    RequestCaps,
    SegmentEncoder,
    ServedModel,
    longest_token_bytes,
    parse_media_hosts,
    thinking_format,
    tool_format,
)
from ..models import model_facts
from ..openai import EmbeddingLimits, ServedEmbedder
from ..settings import Settings
from ._adapters import LoraAdapters
from ._embedding_calls import EmbeddingCalls
from ._extensions import Extensions
from ._jobs import Jobs
from ._metrics import Metrics
from ._model_sources import ModelSource
from ._reservations import Reservation, held
from ._slots import AnyHosted, Hosted, HostedEmbedder

log = logging.getLogger("mlx_nursery.http")


@attrs.frozen
class ModelOpener:
    """The registry's `Opener`: a model's engine of its kind, started in the model's own
    nursery, with what every model of this server shares (settings, metrics, limits)."""

    settings: Settings
    metrics: Metrics
    image_limits: ImageLimits
    extensions: Extensions
    """Their hooks on each text model's plans (`_extensions.py`)."""
    adapters: LoraAdapters = attrs.field(
        default=attrs.Factory(lambda self: LoraAdapters.from_settings(self.settings), True)
    )
    """The LoRA adapters served on the text model (`_adapters.py`)."""

    async def __call__(
        self, source: ModelSource, path: Path, reservation: Reservation, nursery: trio.Nursery
    ) -> AnyHosted:
        return await self._open_model(source, path, reservation, nursery)

    async def _open_model(
        self, source: ModelSource, path: Path, reservation: Reservation, nursery: trio.Nursery
    ) -> AnyHosted:
        """Start `source`'s engine in `nursery` (its own) and present it to the API (the
        registry's `Opener`). Raises what the load raised."""
        facts = await trio.to_thread.run_sync(model_facts, path)
        if facts.kind in ("embedding", "reranker"):
            return await self._open_embedder(source, path, reservation, nursery)
        if facts.kind == "stt":
            return await self._open_speech_model(source, path, reservation, nursery)
        if facts.kind == "tts":
            return await self._open_synthesis_model(source, path, reservation, nursery)
        distribution = None
        if self.settings.distributed is not None:  # rank 0 of an mlx.launch group
            from ..distributed import leader

            distribution = leader(self.settings.distributed, self.settings.distributed_timeout)
        config = EngineConfig(
            path,
            max_concurrency=self.settings.max_concurrency,
            max_queue=self.settings.max_queue,
            max_queue_per_tenant=self.settings.max_queue_per_key,
            priority_aging=self.settings.priority_aging,
            max_preemptions=self.settings.max_preemptions,
            prompt_cache_bytes=reservation.prefix_cache,
            prompt_cache_dir=self.settings.prompt_cache_dir,
            prompt_cache_disk_bytes=self.settings.prompt_cache_disk_bytes,
            # Across devices each rank's own memory holds its own share: the ranks agree it.
            kv_cache_bytes=reservation.kv if distribution is None else self.settings.kv_cache_bytes,
            prefill_batch_size=self.settings.prefill_batch_size,
            prefill_step_size=self.settings.prefill_step_size,
            prefill_chunk_ms=self.settings.prefill_chunk_ms,
            cudnn_attention=self.settings.cudnn_attention,
            cuda_graphs=self.settings.cuda_graphs,
            kv_bits=self.settings.kv_bits,
            kv_group_size=self.settings.kv_group_size,
            fuse_weights=not self.settings.no_fuse_weights,
            ragged_attention=not self.settings.no_ragged_attention,
            pack_chunks=self.settings.pack_chunks,
            warmup=not self.settings.skip_warmup,
            warmup_budget_s=self.settings.warmup_budget,
            single_sequence_fast_path=distribution is None,
            speculation=self.settings.speculation,
            distribution=distribution,
            adapters=tuple(self.adapters.paths.items()),
            enable_adapters=self.adapters.enabled,
        )
        engine: Engine = await nursery.start(Engine(config).run)
        if distribution is not None:
            from ..distributed import report_to

            report_to(engine, distribution)
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
            adapters=self.adapters.paths.keys(),  # a live view: runtime loads show
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
        kept = attrs.evolve(kept, adapters=sum(engine.adapters.values()))
        plans = self.extensions.for_model(served)
        return Hosted(engine, served, jobs, kept, served.card(), plans)

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

    async def _open_synthesis_model(
        self, source: ModelSource, path: Path, reservation: Reservation, nursery: trio.Nursery
    ) -> Hosted:
        """A TTS model: its synthesis engine (thread, lane, queue) in `nursery`; syntheses
        only. Raises what the load raised (a phonemizer not installed among them)."""
        config = SynthesisConfig(path, max_queue=self.settings.max_queue)
        engine: SynthesisEngine = await nursery.start(SynthesisEngine(config).run)
        card = ModelCard(
            id=source.name,
            created=int(time.time()),
            context_length=0,
            input_modalities=["text"],
            kind="speech-synthesis",
            voices=list(engine.info.voices),
        )
        jobs = Jobs(nursery, None, self.settings.request_timeout, self.metrics, source.name)
        return Hosted(engine, None, jobs, reservation, card)

    async def _open_embedder(
        self, source: ModelSource, path: Path, reservation: Reservation, nursery: trio.Nursery
    ) -> HostedEmbedder:
        """An embedding model's or a cross-encoder's engine (its own thread, as any model's),
        started in `nursery`."""
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
            limits=EmbeddingLimits(max_documents=self.settings.max_rerank_documents),
            classifier=model.spec.classifier,
        )
        calls = EmbeddingCalls(embedder, self.settings.request_timeout, self.metrics, source.name)
        return HostedEmbedder(embedder, served, calls, reservation)


def _vocabulary(tokenizer: Any) -> tuple[int, int]:
    """The ids the tokenizer spans (its last id + 1: a vocabulary may have holes) and its
    longest token in bytes, computed once: `get_vocab()` builds a dict of the whole
    vocabulary. Tokenizing once here also makes transformers' one-time reset of the
    tokenizer's truncation state before any request can overlap it."""
    vocabulary = tokenizer.get_vocab()
    tokenizer.encode("warm up")
    return max(vocabulary.values(), default=-1) + 1, longest_token_bytes(vocabulary)


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
