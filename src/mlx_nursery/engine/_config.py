"""Engine configuration: one object, typed defaults, explicit units."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
from attrs import validators as v

from ._chunking import chunk_tokens
from ._drafting import Speculation
from ._kv_quant import KV_BITS, KV_GROUP_SIZES, KVQuantization
from ._priority import PriorityPolicy

if TYPE_CHECKING:
    from ._distribution import Distribution


@attrs.frozen
class EngineConfig:
    model: str | Path
    max_concurrency: int = attrs.field(default=8, validator=v.ge(1))
    """Sequences on the device at once: 1 = strict serialization, N = continuous batching."""
    max_queue: int = attrs.field(default=64, validator=v.ge(0))
    """Requests allowed to wait for a lane; past this, submission fails at once."""
    max_queue_per_tenant: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Of those, the most one tenant (`GenerationRequest.tenant`) may hold, so that one
    client filling the queue leaves the others room. None: half the queue (at least 1)."""

    @property
    def tenant_queue_share(self) -> int:
        if self.max_queue_per_tenant is not None:
            return self.max_queue_per_tenant
        return max(1, self.max_queue // 2)

    priority_aging: int = attrs.field(
        default=attrs.fields(PriorityPolicy).aging.default, validator=v.ge(1)
    )
    """Admissions of better-priority requests that improve a waiting request's class by one
    (`GenerationRequest.priority`; engine/_priority.py): its bound on starvation."""
    max_preemptions: int = attrs.field(
        default=attrs.fields(PriorityPolicy).max_preemptions.default, validator=v.ge(0)
    )
    """Times one request may be taken off the device (its lane or its KV memory) for a
    request of a better class; 0: priorities only order the waits."""

    @property
    def priorities(self) -> PriorityPolicy:
        return PriorityPolicy(self.priority_aging, self.max_preemptions)

    prefill_step_size: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Prompt tokens per prefill chunk: the granularity at which a prefill can be abandoned,
    and the largest chunk while other sequences decode (`prefill_chunk_ms`). None: the
    backend's (`_chunking.CUDA_CHUNK_TOKENS` on CUDA, `CHUNK_TOKENS` elsewhere); read it through
    `chunk_tokens()`."""

    def chunk_tokens(self) -> int:
        """`prefill_step_size`, or the default of this process's MLX device (engine thread:
        it asks MLX)."""
        return chunk_tokens(self.prefill_step_size)

    prefill_chunk_ms: float | None = attrs.field(default=None, validator=v.optional(v.ge(0.0)))
    """While other sequences decode, the time a prefill chunk may hold them: chunks shrink
    to fit it by the measured cost of a token, to powers of two down to 16 tokens
    (engine/_chunking.py). None: the backend's default (`_chunking.CPU_BUDGET_MS`,
    `GPU_BUDGET_MS`); 0: no budget, chunks of `prefill_step_size` always."""
    prefill_batch_size: int = attrs.field(default=8, validator=v.ge(1))
    prompt_cache_bytes: int = attrs.field(default=2 << 30, validator=v.ge(0))
    """Byte budget of the prefix KV cache; 0 disables it."""
    kv_cache_bytes: int | None = attrs.field(default=None, validator=v.optional(v.ge(0)))
    """Memory for the running sequences' KV. None: derived from the device's memory (80% of
    it, less the weights and `prompt_cache_bytes`; engine/_memory.py). The engine holds
    arrivals back, and takes the newest sequence out of the batch to replay it later, rather
    than outgrow it; the served context length is capped by it."""
    kv_bits: int | None = attrs.field(default=None, validator=v.optional(v.in_(KV_BITS)))
    """Quantize the KV cache to this many bits per value (4 or 8; None: the model's dtype),
    from the first token, in the batch, the fast path and the prefix cache alike
    (engine/_kv_quant.py). The KV budget counts quantized bytes, so it holds more tokens."""
    kv_group_size: int = attrs.field(default=64, validator=v.in_(KV_GROUP_SIZES))
    """Values sharing one scale and bias when `kv_bits` is set; must divide the model's KV
    head dimension."""
    prompt_cache_dir: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path)
    )
    """A directory for the prefix cache's disk tier (None: none). Ended sequences' KV of at
    least `prompt_cache_disk_block` tokens is written there in the background, and read back
    where memory holds a shorter prefix of a prompt, after a restart too (engine/_disk_kv.py,
    docs/decisions/0043-prefix-cache-on-disk.md). Several models and servers may share it."""
    prompt_cache_disk_bytes: int = attrs.field(default=10 << 30, validator=v.ge(0))
    """The most bytes of files in `prompt_cache_dir`, every model's together: past it, the
    least recently used files are deleted. 0: no disk tier."""
    prompt_cache_disk_read_rate: float | None = attrs.field(
        default=None, validator=v.optional(v.gt(0))
    )
    """Bytes per second a read from the disk tier (the file read and checked, its prefix
    copied into MLX) is expected to run at until one has been measured (None: the first read
    is taken, and measured). A read expected to take longer than prefilling the tokens it
    spares is skipped (engine/_disk_rates.py); a very high rate reads always."""
    prompt_cache_disk_block: int = attrs.field(default=256, validator=v.ge(1))
    """Tokens per block of the disk tier's file names: the shortest prefix written, and the
    granularity at which a prompt finds the file holding its longest prefix."""
    prompt_cache_entries: int = attrs.field(default=64, validator=v.ge(1))
    prompt_cache_ttl: float = attrs.field(default=600.0, validator=v.gt(0))
    """Seconds an unused prefix-cache entry is kept."""
    max_buffered_events: int = attrs.field(default=65536, validator=v.ge(2))
    """Undelivered events per request before its consumer counts as stalled and it is
    cancelled. A request's buffer holds at most the events it can produce (its `max_tokens`
    and its end), so a reader slower than the model, on a slow link, is cut only where its
    request may write more than this: its tokens wait for it, as their text would in a
    non-streaming reply; the batch never waits for a reader."""
    cancel_ack_timeout: float = attrs.field(default=30.0, validator=v.gt(0))
    """Longest a cancelled request waits (shielded) for the engine to confirm its stop."""
    single_sequence_fast_path: bool = True
    """Run a lone sequence outside BatchGenerator (faster at batch 1; same tokens)."""
    speculation: Speculation | None = None
    """Speculative decoding by prompt lookup for a lone sequence on the fast path (None:
    off): the same tokens, several per step where its context repeats itself
    (engine/_speculating.py, `_drafting.py`)."""
    max_consecutive_step_failures: int = attrs.field(default=3, validator=v.ge(1))
    """Batch steps failing in a row before the engine declares itself dead."""
    cudnn_attention: bool = False
    """On CUDA, run attention through cuDNN's fused kernel (MLX's `MLX_CUDA_USE_CUDNN_SDPA`,
    set from this before loading; it covers prefill, and decode over a KV cache past 256
    tokens). It is faster on long prefills once a shape has been seen, but builds a graph
    for every new (query length, key length), tens of milliseconds each, and real traffic
    brings new lengths with nearly every request; its decode steps take longer to launch.
    Off, a query of several tokens (prefill chunks, verifies) runs the engine's sequence
    attention (cuBLAS products and a masked-softmax kernel, `_sequence_attention.py`), which
    builds nothing per shape (docs/architecture.md, "Shape compiles"), and decode MLX's
    vector kernel. No effect on
    other backends. MLX reads the switch once per process, at its first attention on the
    GPU: the first engine's choice holds."""
    cuda_graphs: bool = False
    """On CUDA, let MLX record each command buffer as a CUDA graph (`MLX_USE_CUDA_GRAPHS`,
    set from this before loading). A graph's kernels run back to back, but the engine
    thread then adds each kernel to a graph and captures each matrix product as one, which
    cost a busy batch more host time than launching them: it ran faster without graphs, a
    lone stream with them (docs/benchmarks.md); under them only the decode prelude writes
    the KV in place (decisions/0059). MLX reads the switch once per process, at its first
    command buffer: the first engine's choice holds. No effect on other backends."""
    fuse_weights: bool = True
    """Run each layer's q/k/v projections as one matmul, and its gate/up projections as one,
    with weights concatenated at load (models/_fusing.py): fewer kernel launches per step,
    the same outputs. Architectures not covered load as they are."""
    adapters: tuple[tuple[str, Path], ...] = ()
    """LoRA adapters loaded with the model, as (name, directory): requests name one
    (`GenerationRequest.adapter`); rows of different adapters decode in one batch
    (`_adapters.py`, models/_lora.py)."""
    enable_adapters: bool = False
    """Serve adapters (loaded at runtime, `Engine.load_adapter`) even if none is given at
    load; implied by `adapters`. Text models only. Fused projections stay fused: an adapted
    projection adds its rows' deltas to its slice of the group's product."""

    @property
    def serves_adapters(self) -> bool:
        return self.enable_adapters or bool(self.adapters)

    ragged_attention: bool = True
    """On CUDA, a batch's decode attention by this server's kernel, each row reading only its
    own keys (`_decode_attention.py`) rather than MLX's masked fallback over every row's
    padded length. No effect on other backends."""
    pack_chunks: bool = False
    """Run a prefill chunk beside a decoding batch in the decode step's forward (`_packed.py`):
    the layers' norms, projections and MLP launched once over both, for the architectures it
    reads; others (and speculation's verify steps, LoRA batches, distributed groups) run the
    chunk as a forward of its own. Off by default: it measured no faster on a GPU or the CPU
    (decisions/0051)."""

    @property
    def packs_chunks(self) -> bool:
        """Whether this engine's batches pack chunks: `pack_chunks`, and neither speculation
        nor adapters (their batches run chunks apart)."""
        return self.pack_chunks and self.speculation is None and not self.serves_adapters

    warmup: bool = True
    """Before reporting ready, run what serving runs (the fast path, batches up to
    `max_concurrency`, the sampling variants) on dummy prompts, so that no request waits for
    MLX to build kernels on first use (engine/_warmup.py)."""
    warmup_budget_s: float = attrs.field(default=60.0, validator=v.ge(0))
    """Seconds the warm-up may take; phases left when they have passed are skipped."""
    distribution: Distribution | None = attrs.field(default=None, eq=False)
    """Serving one model across devices, as rank 0 of an `mlx.launch` group
    (engine/_distribution.py, distributed/); None: this device alone."""
    check_invariants: bool = attrs.field(
        factory=lambda: os.environ.get("MLX_NURSERY_CHECK_INVARIANTS") == "1"
    )
    """Assert the engine thread's invariants after every iteration (`Worker`): for tests,
    which turn it on through the environment variable; a violation stops the engine."""

    @property
    def kv_quantization(self) -> KVQuantization | None:
        """How the KV cache is quantized (None: it is not)."""
        if self.kv_bits is None:
            return None
        return KVQuantization(self.kv_bits, self.kv_group_size)
