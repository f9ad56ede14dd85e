"""Steppers: what runs the model's steps for the sequences the worker gives them.

The worker holds one stepper at a time and drives it through one interface: `insert` a
sequence at a `Start`, `step` (one decode step for every sequence, or one prefill chunk),
`remove` sequences (returning their KV state for the prefix cache), `close`. There are two:

- `BatchStepper`, over mlx-lm's `BatchGenerator` (continuous batching) with our prefill
  schedule (`_schedule.py`). This module and that one are the only ones that touch
  `BatchGenerator`; only that one touches its internals.
- `SoloStepper` (`_solo.py`), the single-sequence fast path, stepped as `generate_step` is.

When company arrives for a lone sequence the worker swaps the solo stepper for the batch
one: `SoloStepper.handover` gives the `Start` at which the batch continues it identically.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

import attrs
import mlx.core as mx

from ._adapters import RowAdapters
from ._batch_speculating import BatchSpeculation, Report
from ._chunking import ChunkSizer
from ._drafting import Speculation
from ._kv_quant import CacheFactory
from ._ragged import ragged_rows
from ._sampling import Sampler, sample_batch
from ._schedule import ServingBatchGenerator
from ._sequence import LiveSequence, Response
from ._upstream import StopSequences, make_prompt_cache, sampler_rows

KVState = tuple[list[Any] | None, list[int] | None]
"""A removed sequence's KV cache and the tokens it holds (None, None: not kept)."""

Draw = Callable[[Sequence[Sampler], mx.array], mx.array]
"""How a batched step's tokens are drawn from its rows' samplers and logprobs: by
`sample_batch`, or, served across devices, by rank 0's draw shared with every rank
(distributed/), so that all ranks feed the same tokens."""


@attrs.frozen
class Start:
    """Where a sequence starts in a stepper: `cache` holds `cache_tokens`; `prompt` is what
    it does not hold yet (prefilled first); at most `max_tokens` tokens follow."""

    prompt: list[int]
    cache: list[Any] | None
    cache_tokens: list[int]
    max_tokens: int


class Stepper(Protocol):
    kind: Literal["solo", "batch"]

    def insert(self, sequence: LiveSequence, start: Start) -> int:
        """Take `sequence` at `start`; return its uid. Raises if it cannot: nothing taken."""

    def step(self) -> list[Response]:
        """Run one step (a token for every decoding sequence, or a prefill chunk)."""

    def remove(self, uids: list[int], *, keep_state: bool) -> dict[int, KVState]:
        """Drop sequences; no step runs for them after this. Waits for a step in flight."""

    def close(self) -> None: ...

    @property
    def uids(self) -> frozenset[int]:
        """The sequences it holds (for the worker's invariant checks)."""

    @property
    def prefilled(self) -> int:
        """Prompt tokens it has run in prefill chunks."""

    @property
    def token_in_flight(self) -> bool:
        """A token is computing that the next `step` returns (the posting rule asks)."""

    @property
    def drafting(self) -> frozenset[int]:
        """The batch rows holding speculation's drafting state (a subset of `uids`, for the
        invariant checks; the fast path's lone sequence keeps its own: empty there)."""


class _RowSamplers:
    """The one sampler object every row of the batch is given, so that `BatchGenerator`
    samples a step's rows in one call; it samples each row by that row's own sampler
    (`sample_batch`, which draws exactly what the row's sampler would alone).

    `BatchGenerator` calls a sampler with the step's logprobs only, not the rows' ids, and
    the rows are those of whichever generation batch is stepping (the running one, or one
    just prefilled that samples its first tokens). The caller's frame is that batch
    (mlx-lm 0.32.2's `GenerationBatch._step`, pinned in pyproject.toml): its `uids` name
    the rows (`_upstream.sampler_rows`). A caller without them is a bug to surface, not to
    guess around; tests/engine/test_upstream_contract.py would catch a change upstream."""

    def __init__(self, draw: Draw = sample_batch) -> None:
        self.by_uid: dict[int, Sampler] = {}
        self._draw = draw

    def __call__(self, logprobs: mx.array) -> mx.array:
        uids = sampler_rows()  # called here, in the sampler's own frame
        if uids is None or len(uids) != logprobs.shape[0]:
            raise RuntimeError("cannot tell which sequences a batched draw is for")
        return self._draw([self.by_uid[uid] for uid in uids], logprobs)


class BatchStepper:
    """Continuous batching by mlx-lm's `BatchGenerator`."""

    kind: Literal["solo", "batch"] = "batch"

    def __init__(
        self,
        model: Any,
        *,
        max_concurrency: int,
        prefill_batch_size: int,
        prefill_step_size: int,
        chunk_sizer: ChunkSizer | None = None,
        make_cache: CacheFactory | None = None,
        draw: Draw = sample_batch,
        fold_first_tokens: bool = True,
        adapters: RowAdapters | None = None,
        speculation: Speculation | None = None,
        verified: Report | None = None,
        draft_model: Any = None,
        pack_chunks: bool = False,
    ) -> None:
        """`fold_first_tokens`: a prompt's first token comes from its last prefill chunk
        where the model allows it (`_first_tokens.py`); off, from a forward of its own.
        `pack_chunks`: a prefill chunk beside decoding rows runs in their step's forward
        where the model allows it (`_packed.py`; the generator itself keeps batches with
        adapters or speculation apart).
        `adapters`: the rows' LoRA adapters (`_adapters.py`; None: the base model only).
        `speculation`: rows draft and verify inside the batch (`_batch_speculating.py`;
        None: off), each verify reported to `verified`; `draft_model`: drafts come from it
        where the method is "draft"."""
        self._model = model
        self._adapters = adapters or RowAdapters(None)
        self._slots: dict[int, int] = {}
        """Each row's adapter slot, by uid (rows of the base: absent)."""
        self._make_cache = make_cache
        """Fresh caches for prompts that bring none (None: mlx-lm's, made by the generator)."""
        self._generator = ServingBatchGenerator(
            model,
            completion_batch_size=max_concurrency,
            prefill_batch_size=min(prefill_batch_size, max_concurrency),
            prefill_step_size=prefill_step_size,
            chunk_sizer=chunk_sizer,
            fold_first_tokens=fold_first_tokens,
            rows=self._rows if adapters is not None else None,
            pack_chunks=pack_chunks,
        )
        self._samplers = _RowSamplers(draw)
        """Also the record of the rows it holds: a row's sampler is kept exactly as long."""
        self._speculation = (
            None
            if speculation is None
            else BatchSpeculation(speculation, model, self._samplers.by_uid, verified, draft_model)
        )
        self._generator.speculation = self._speculation

    def insert(self, sequence: LiveSequence, start: Start) -> int:
        adapter = sequence.request.adapter
        uid = self.insert_row(
            start,
            sampler=sequence.sampler,
            processors=sequence.processors,
            stop_ids=sequence.stop_ids,
            slot=self._adapters.slot(adapter),
        )
        if self._speculation is not None:
            self._speculation.add(uid, sequence)
        return uid

    def insert_row(
        self,
        start: Start,
        *,
        sampler: Sampler,
        processors: list[Any],
        stop_ids: frozenset[int],
        slot: int = 0,
    ) -> int:
        """`insert` by a sequence's parts (a follower rank has no `LiveSequence`); `slot`:
        its adapter's (0: the base)."""
        cache = start.cache
        if cache is None:
            cache = (self._make_cache or make_prompt_cache)(self._model)
        cache = ragged_rows(cache)
        (uid,) = self._generator.insert(
            [start.prompt],
            max_tokens=[start.max_tokens],
            caches=[cache],
            all_tokens=[start.cache_tokens],
            samplers=[self._samplers],
            logits_processors=[processors],
            stop_sequences=[StopSequences([[t] for t in sorted(stop_ids)])],
        )
        self._samplers.by_uid[int(uid)] = sampler
        if slot:
            self._slots[int(uid)] = slot
        return int(uid)

    def _rows(self, uids: list[int]) -> AbstractContextManager[None]:
        """The forwards of the rows `uids` (in batch order) run with their adapters."""
        return self._adapters.use([self._slots.get(uid, 0) for uid in uids])

    def step(self) -> list[Response]:
        responses: list[Response] = self._generator.next()[1]
        for response in responses:
            if response.finish_reason is not None:
                self._samplers.by_uid.pop(response.uid, None)  # the generator drops it itself
                self._slots.pop(response.uid, None)
                if self._speculation is not None:
                    self._speculation.drop(response.uid)
        return responses

    def remove(self, uids: list[int], *, keep_state: bool) -> dict[int, KVState]:
        """One call for all: each removal filters every layer's KV of the whole batch."""
        caches: dict[int, KVState] = self._generator.remove(uids, return_prompt_caches=keep_state)
        for uid in uids:
            self._samplers.by_uid.pop(uid, None)
            self._slots.pop(uid, None)
            if self._speculation is not None:
                self._speculation.drop(uid)
        return caches if keep_state else {}

    def close(self) -> None:
        self._samplers.by_uid.clear()
        self._slots.clear()
        if self._speculation is not None:
            self._speculation.clear()
        self._generator.close()

    @property
    def uids(self) -> frozenset[int]:
        return frozenset(self._samplers.by_uid)

    @property
    def drafting(self) -> frozenset[int]:
        return frozenset() if self._speculation is None else self._speculation.rows

    @property
    def prefilled(self) -> int:
        return self._generator.prefilled_tokens

    @property
    def token_in_flight(self) -> bool:
        return False  # the posting rule defers only a lone stream's tokens
