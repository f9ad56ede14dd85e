"""The settings of what is served and how: the models, the address, the engine, shutdown,
engine failures and logging. `Settings` (`_settings.py`) adds the rest to them; the
fields keep this order in --help and README's table."""

from __future__ import annotations

from typing import Any

import attrs
from attrs import validators as v

from ..engine import KV_BITS, KV_GROUP_SIZES, SPECULATION_METHODS, EmbedderConfig, Speculation
from ..logs import LOG_FORMATS
from ..openai import EmbeddingLimits
from ._fields import SettingsError, described, engine_default, one_of, optional_positive, strings

LOG_LEVELS = ("debug", "info", "warning", "error")


def _speculation_default(name: str) -> Any:
    """Speculation's default for `name`: stated once, in the engine."""
    return attrs.fields_dict(Speculation)[name].default


@attrs.frozen
class ServerSettings:
    """The first settings: what is served, where, on what engine, and how it logs."""

    model: tuple[str, ...] = attrs.field(
        default=(),
        converter=strings,
        metadata=described(
            "PATH[=NAME]: a local mlx-lm or mlx-vlm directory, or a repo id already in the HF"
            " cache (never downloaded), served as NAME; repeat it to serve several",
            none="the built-in model",
        ),
    )
    """Empty (and no `models_dir`): the built-in default model (models/default.py)."""
    models_dir: str | None = attrs.field(
        default=None,
        metadata=described(
            "serve every model directory under this folder, each by its folder name"
        ),
    )
    max_loaded_models: int = attrs.field(
        default=1,
        validator=v.ge(1),
        metadata=described(
            "models loaded at once; a request for another unloads the least recently used idle"
            " one first"
        ),
    )
    memory_budget: int | None = attrs.field(
        default=None,
        validator=v.optional(v.ge(1)),
        metadata=described(
            "memory the loaded models may reserve together (weights, KV, prefix cache); each"
            " model's KV defaults to its share of it",
            none="80% of device memory",
            unit="bytes",
        ),
    )
    preload: tuple[str, ...] = attrs.field(
        default=(),
        converter=strings,
        metadata=described(
            "a served model name to load at startup (repeatable)", none="the only model if one"
        ),
    )
    host: str = attrs.field(default="127.0.0.1", metadata=described("address to bind"))
    port: int = attrs.field(
        default=8000, validator=[v.ge(0), v.le(65535)], metadata=described("port to bind")
    )
    max_concurrency: int = attrs.field(
        default=engine_default("max_concurrency"),
        validator=v.ge(1),
        metadata=described("sequences on the device at once; 1 serializes, N batches continuously"),
    )
    max_queue: int = attrs.field(
        default=engine_default("max_queue"),
        validator=v.ge(0),
        metadata=described("requests waiting for a lane; past it, 503 with Retry-After"),
    )
    max_queue_per_key: int | None = attrs.field(
        default=None,
        validator=v.optional(v.ge(1)),
        metadata=described(
            "of --max-queue, the places one API key may hold (with keys set), so that one"
            " client filling the queue leaves the others room; past it, 503 for that key",
            none="half of --max-queue",
        ),
    )
    priority_aging: int = attrs.field(
        default=engine_default("priority_aging"),
        validator=v.ge(1),
        metadata=described(
            "admissions of better-priority requests after which a waiting request is served as"
            " one class better (its bound on starvation)"
        ),
    )
    max_preemptions: int = attrs.field(
        default=engine_default("max_preemptions"),
        validator=v.ge(0),
        metadata=described(
            "times one request may be taken off the device (resumed later, its tokens kept)"
            " for a request of a better priority; 0: priorities only order the queue"
        ),
    )
    shared_prefix_cache: bool = attrs.field(
        default=False,
        metadata=described(
            "with API keys set, share cached prompt prefixes across keys (by default each"
            " key's are its own: a cached-token count could otherwise tell one key what"
            " another's prompts held)"
        ),
    )
    request_timeout: float | None = attrs.field(
        default=600.0,
        validator=optional_positive,
        metadata=described(
            "seconds per request, queueing included", none="no limit", unit="seconds"
        ),
    )
    default_max_tokens: int | None = attrs.field(
        default=None,
        validator=optional_positive,
        metadata=described("max_tokens when a request gives none", none="context room"),
    )
    """None: up to the model's context length."""
    served_model_name: str | None = attrs.field(
        default=None,
        metadata=described(
            "the model id clients send as `model`, for a server of one model (several: PATH=NAME)",
            none="the model's name",
        ),
    )
    prefill_batch_size: int = attrs.field(
        default=engine_default("prefill_batch_size"),
        validator=v.ge(1),
        metadata=described(
            "prompts prefilled together in one step beside the running batch's decode"
        ),
    )
    prefill_step_size: int | None = attrs.field(
        default=engine_default("prefill_step_size"),
        validator=v.optional(v.ge(1)),
        metadata=described(
            "prompt tokens per prefill chunk (by backend: 1024 on CUDA, 512 elsewhere);"
            " a cancel is honoured between chunks",
            none="by backend",
        ),
    )
    prefill_chunk_ms: float | None = attrs.field(
        default=engine_default("prefill_chunk_ms"),
        validator=v.optional(v.ge(0)),
        metadata=described(
            "milliseconds a prefill chunk may hold the streams decoding beside it: chunks shrink"
            " to fit by the measured cost of a token (by backend: 250 on the CPU, 1000 on a"
            " GPU); 0: always --prefill-step-size",
            none="by backend",
        ),
    )
    embedding_batch_size: int = attrs.field(
        default=attrs.fields_dict(EmbedderConfig)["max_batch_inputs"].default,
        validator=v.ge(1),
        metadata=described("inputs in one forward of an embedding model, from every request there"),
    )
    embedding_batch_tokens: int = attrs.field(
        default=attrs.fields_dict(EmbedderConfig)["max_batch_tokens"].default,
        validator=v.ge(1),
        metadata=described(
            "padded tokens in one forward of an embedding model (inputs times the longest)"
        ),
    )
    max_rerank_documents: int = attrs.field(
        default=attrs.fields_dict(EmbeddingLimits)["max_documents"].default,
        validator=v.ge(1),
        metadata=described(
            "documents in one /v1/rerank request, and texts on either side of one /v1/score request"
        ),
    )
    prompt_cache_bytes: int | None = attrs.field(
        default=None,
        validator=v.optional(v.ge(0)),
        metadata=described(
            "prefix KV cache budget in bytes; 0 disables it",
            none="a quarter of what the model's memory share leaves after its weights (at"
            " least 2 GiB)",
            unit="bytes",
        ),
    )
    prompt_cache_dir: str | None = attrs.field(
        default=None,
        metadata=described(
            "a directory where the prefix cache keeps long prompts' KV on disk (written in the"
            " background, read back on a later request or after a restart)",
            none="none: memory only",
        ),
    )
    prompt_cache_disk_bytes: int = attrs.field(
        default=engine_default("prompt_cache_disk_bytes"),
        validator=v.ge(0),
        metadata=described(
            "the most bytes of files in --prompt-cache-dir, every model's together; past it,"
            " the least recently used are deleted; 0: no disk tier",
            unit="bytes",
        ),
    )
    kv_cache_bytes: int | None = attrs.field(
        default=engine_default("kv_cache_bytes"),
        validator=v.optional(v.ge(0)),
        metadata=described(
            "memory for the running requests' KV; arrivals wait and the newest request is"
            " paused rather than outgrow it; it caps the context length served",
            none="from device memory",
            unit="bytes",
        ),
    )
    kv_bits: int | None = attrs.field(
        default=engine_default("kv_bits"),
        validator=one_of(*KV_BITS),
        metadata=described(
            "quantize the KV cache to 4 or 8 bits per value: more tokens in the same memory,"
            " batched as ever",
            none="off",
        ),
    )
    kv_group_size: int = attrs.field(
        default=engine_default("kv_group_size"),
        validator=one_of(*KV_GROUP_SIZES),
        metadata=described("values sharing one scale and bias with --kv-bits (32, 64 or 128)"),
    )
    speculative: str | None = attrs.field(
        default=None,
        validator=v.optional(v.in_(SPECULATION_METHODS)),
        metadata=described(
            "speculative decoding: ngram drafts each request's next tokens from its own"
            " context (prompt lookup), draft by --draft-model, and verifies them in one"
            " forward, every request of the batch in the same one; the same output, faster"
            " where the drafts hold",
            none="off",
        ),
    )
    draft_model: str | None = attrs.field(
        default=None,
        metadata=described(
            "a smaller model with the served model's tokenizer that drafts for --speculative"
            " draft (implies it)",
            none="none",
        ),
    )
    lora: tuple[str, ...] = attrs.field(
        default=(),
        converter=strings,
        metadata=described(
            "NAME=PATH: serve the mlx-lm LoRA adapter directory PATH as the model NAME, on the"
            " served text model; repeat it for several (they batch together); implies"
            " --enable-lora",
            none="none",
        ),
    )
    enable_lora: bool = attrs.field(
        default=False,
        metadata=described(
            "serve LoRA adapters on the text model (loaded at runtime by POST"
            " /v1/load_lora_adapter); its projections are then not fused"
        ),
    )
    speculative_tokens: int = attrs.field(
        default=_speculation_default("tokens"),
        validator=[v.ge(1), v.le(32)],
        metadata=described("most tokens drafted for one step with --speculative"),
    )
    speculative_ngram_max: int = attrs.field(
        default=_speculation_default("ngram_max"),
        validator=[v.ge(1), v.le(16)],
        metadata=described("longest context suffix --speculative ngram looks up, tried first"),
    )
    speculative_ngram_min: int = attrs.field(
        default=_speculation_default("ngram_min"),
        validator=v.ge(1),
        metadata=described(
            "shortest context suffix --speculative ngram looks up (at most --speculative-ngram-max)"
        ),
    )

    @speculative_ngram_min.validator
    def _check_ngram_min(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value > self.speculative_ngram_max:
            raise SettingsError(
                f"speculative_ngram_min ({value}) must not exceed speculative_ngram_max"
                f" ({self.speculative_ngram_max})"
            )

    @draft_model.validator
    def _check_draft_model(self, attribute: attrs.Attribute[str | None], value: str | None) -> None:
        if value is None and self.speculative == "draft":
            raise SettingsError("--speculative draft needs --draft-model")
        if value is not None and self.speculative == "ngram":
            raise SettingsError("--draft-model drafts for --speculative draft, not ngram")

    @property
    def speculation(self) -> Speculation | None:
        """The engine's speculation settings (None: off). A draft model implies "draft"."""
        method = "draft" if self.draft_model is not None else self.speculative
        if method is None:
            return None
        return Speculation(
            method,
            tokens=self.speculative_tokens,
            ngram_max=self.speculative_ngram_max,
            ngram_min=self.speculative_ngram_min,
            draft_model=self.draft_model,
        )

    stream_interval: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata=described(
            "tokens per streamed chunk after the first; 0: 1, and 1 more per 8 streams beyond 8",
            zero="by load",
        ),
    )
    """Pieces of text (about one per token) per SSE write after the first, which always goes
    at once (vLLM's --stream-interval). 0 adapts to load: 1 while up to 8 streams are open,
    one more per 8 streams beyond (32 streams: 4); see serving/_batching.py."""
    shutdown_grace: float = attrs.field(
        default=10.0,
        validator=v.ge(0),
        metadata=described("seconds in-flight requests get after SIGTERM/SIGINT", unit="seconds"),
    )
    """In-flight requests still running after it are cancelled with a final error event."""
    on_engine_failure: str = attrs.field(
        default="restart",
        validator=v.in_(("restart", "exit")),
        metadata=described(
            "when a model's engine thread dies: restart it (load the model again, at most"
            " --engine-restarts times) or exit non-zero for a supervisor to restart the server"
        ),
    )
    engine_restarts: int = attrs.field(
        default=3,
        validator=v.ge(0),
        metadata=described(
            "restarts of a dead engine per model before the server exits non-zero"
            " (--on-engine-failure restart)"
        ),
    )
    distributed: str | None = attrs.field(
        default=None,
        validator=v.optional(v.in_(("tensor", "pipeline"))),
        metadata=described(
            "serve one model across the ranks of an `mlx.launch` group: tensor or pipeline"
            " parallel; rank 0 serves HTTP, the other ranks follow its steps"
            " (docs/deployment.md)",
            none="this device alone",
        ),
    )
    # 8 s: a stalled group's /health turns 503 within 10 s of the stall, the watchdog's
    # checks and the report included; no served step comes near it once warmed up.
    distributed_timeout: float = attrs.field(
        default=8.0,
        validator=v.gt(0),
        metadata=described(
            "seconds a rank waits on the others (a broadcast, a step) before the group counts"
            " as failed: /health turns 503 and every rank exits non-zero",
            unit="seconds",
        ),
    )
    log_level: str = attrs.field(
        default="info",
        validator=v.in_(LOG_LEVELS),
        metadata=described(
            "debug, info, warning or error; prompts and completions are never logged"
        ),
    )
    log_format: str = attrs.field(
        default="text",
        validator=v.in_(LOG_FORMATS),
        metadata=described(
            "text, or json: one JSON object per line, a request's line with its fields"
        ),
    )
