"""What crosses between the Trio side and the engine thread: commands in, deliveries out.

Commands go in through a thread-safe queue that only the engine thread reads. Deliveries go
out through one `post` callable (a Trio `run_sync_soon`), each carrying every event of a
step and the sequences confirmed gone. Nothing here holds an MLX object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal, NamedTuple

import attrs

from ._adapters import AdapterChange
from ._detokenizer import TokenTexts
from ._disk_entries import DiskCacheStats
from ._prefix_cache import PrefixCacheStats
from ._types import FinishReason, GenerationRequest, Tokenizer, TokenLogprob, Usage
from ._vision import VisionProcessor


@attrs.frozen
class Submit:
    seq_id: int
    request: GenerationRequest
    label: str | None = None
    """The request's label (its HTTP request id), for the fault seam (`fault_points`)."""


@attrs.frozen
class Cancel:
    seq_id: int


@attrs.frozen
class Suspend:
    """Take the sequence off the device for a request of a better class: it gives up its
    lane (answered in `Delivery.suspended`, or `Delivery.kept` if it cannot)."""

    seq_id: int


@attrs.frozen
class Resume:
    """A suspended sequence has a lane again: replay it once its KV fits."""

    seq_id: int


@attrs.frozen
class Stop:
    pass


@attrs.frozen
class Wake:
    """Nothing to apply: a read from disk is over (the loop, blocked while only such reads
    were running, takes its next iteration)."""


Command = Submit | Cancel | Suspend | Resume | Stop | Wake | AdapterChange


@attrs.frozen
class WorkerStats:
    """Counters since the engine started. `prompt_tokens_processed` counts prefill-chunk
    tokens: each prompt's last token is run by its first decode step instead."""

    steps: int
    active: int
    prompt_tokens_processed: int
    generated_tokens: int
    failed_steps: int
    prefix_cache: PrefixCacheStats | None
    solo_steps: int = 0
    """Steps run on the single-sequence fast path (the rest went through BatchGenerator)."""
    handovers: int = 0
    """Lone sequences moved into the batch when company arrived."""
    isolated_failures: int = 0
    """Sequences failed alone because a step failed with them as the one suspect."""
    replays: int = 0
    """Sequences rebuilt (prompt and tokens so far prefilled again) after a failed step."""
    prefill_forwards: int = 0
    """Prefill forwards run (a chunk of one or more prompts; decode steps are not counted)."""
    preemptions: int = 0
    """Sequences taken out of the batch to stay within the KV budget (each replayed later)."""
    held_for_memory: int = 0
    """Submissions that had to wait because the KV budget could not take them yet."""
    prefill_shapes: int = 0
    """Distinct (batch, query length, key length) among them: each was new to the backend
    once (see `_shapes`; on CUDA with cuDNN attention, each built a graph)."""
    prefill_chunks_beside_decode: Mapping[int, int] = attrs.field(factory=dict)
    """Prefill chunks run while other sequences were decoding, by the tokens per prompt
    each was given: `prefill_step_size`, or less where the time budget shrank it
    (`_chunking.ChunkSizer`; a prompt's last chunk may hold fewer)."""
    prefill_seconds_per_token: float | None = None
    """The moving average of a prefilled token's measured cost that sizes those chunks
    (None: no chunk measured yet)."""
    verify_steps: int = 0
    """Speculation's verify steps: forwards of a sequence's next token and drafted tokens."""
    draft_tokens: int = 0
    """Tokens speculation drafted (vLLM's `spec_decode_num_draft_tokens`)."""
    accepted_draft_tokens: int = 0
    """Of those, tokens accepted and kept (vLLM's `spec_decode_num_accepted_tokens`)."""
    priority_preemptions: Mapping[int, int] = attrs.field(factory=dict)
    """Sequences taken off the device for a request of a better class (their lane or their
    KV memory), by their priority; each resumed later with its tokens."""
    prefix_disk: DiskCacheStats | None = None
    """The prefix cache's disk tier (None: it has none)."""


class StepEvent(NamedTuple):
    """One sequence's output in a step, before detokenizing.

    The receiving side turns it into a `TokenEvent`: it detokenizes there, on its own
    thread, while this one launches the next step. Detokenizing was the largest piece of
    Python a token cost this thread, which a lone stream of a large model is bound by.
    """

    token_id: int | None
    logprob: TokenLogprob | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None

    @property
    def is_final(self) -> bool:
        return self.finish_reason is not None


@attrs.frozen
class Delivery:
    """One hop to Trio: every event of a step, and the sequences confirmed gone."""

    events: list[tuple[int, StepEvent]]
    finished: list[int]
    stats: WorkerStats
    closing: Literal["closed", "failed"] | None = None  # set on the thread's last delivery
    suspended: list[int] = attrs.field(factory=list)
    """Sequences taken off the device (`Suspend`): they compute nothing and hold no KV, so
    their lanes may go to others; each waits for a lane again (then `Resume`)."""
    kept: list[int] = attrs.field(factory=list)
    """Sequences a `Suspend` could not take off (ended, or not running): they keep going."""


@attrs.frozen
class ModelInfo:
    """What the Trio side may know about the loaded model (no MLX objects)."""

    path: str
    tokenizer: Tokenizer
    """mlx-lm's `TokenizerWrapper` (the engine serves text models only)."""
    context_length: int
    """The longest sequence served: the model's context, capped by the KV budget."""
    eos_token_ids: frozenset[int]
    texts: TokenTexts
    """What its token ids stand for: detokenizers, token bytes (`_detokenizer.TokenTexts`)."""
    vocab_size: int
    """The token ids the model takes: its embedding rows, the width of its logits. Often more
    than the tokenizer has text for (padded rows); an id at or past it is out of range."""
    vision: VisionProcessor | None = None
    """A vision-language model's processor for prompts with images (None: text only)."""
    kv_budget_tokens: int | None = None
    """Tokens of KV the running sequences may hold (`_memory.KVBudget`); None: no limit."""
    kv_bytes_per_token: int = 0
    """What a token's KV costs in this model's caches, measured (0: no growing KV cache)."""
    scripted: bool = False
    """The scripted model (no weights: each request's `Script` says its output and timing)."""
    adapters: Mapping[str, int] = attrs.field(factory=dict)
    """The LoRA adapters loaded with the model, by name: their bytes (`EngineConfig.adapters`)."""
    serves_adapters: bool = False
    """Adapters may be loaded at runtime (`Engine.load_adapter`)."""

    @property
    def token_bytes(self) -> Callable[[int], bytes]:
        """A token id's exact bytes (`TokenTexts.token_bytes`)."""
        return self.texts.token_bytes
