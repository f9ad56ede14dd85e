"""mlx-lm's `BatchGenerator` with a prefill schedule that does not idle prompts between
their prefill and their first token. The only module that touches `BatchGenerator`'s
internals (pinned: mlx-lm 0.32.2, whose `_next` this replaces;
tests/engine/test_upstream_contract.py asserts the internals it reads, and that the `_next`
it replaces is unchanged).

Each call of mlx-lm's `_next` runs one decode step of the running batch and one prefill
chunk of the prompt batch, in this order: decode; admit waiting prompts into the prompt
batch (up to `prefill_batch_size`); move prompts whose prefill ended *in an earlier call*
into the running batch; prefill the next chunk. So a prompt whose prefill ended waits a
whole call before its first token is even computed, and, since admission counts the
prompt batch before those leave it, the next group of prompts cannot start in the call
that moves the previous group out: a full prompt batch turns over every second call. A
wave of arrivals (closed-loop clients that finish together) queues for that many calls,
each as long as a prefill chunk. (Measured on an H100, a wave's own prefill cost dominates
its time to first token whichever the order: docs/benchmarks.md.)

`ServingBatchGenerator._next` keeps the same data structures and steps, in the order:
decode; admit; move prompts with nothing to prefill out; prefill a chunk; move the
prompts whose prefill just ended into the running batch at once (their first token is
computed with the next decode step). A prompt batch can turn over every call, and a
prompt's first token comes one call after its last chunk. Where the chunk rides in the
decode step (below), admission and the chunk's plan come first, then the step, then the
chunk's moves, then admission again into the room the step's finished rows left: a prompt
admitted there has its first chunk in the next call's step (a call later than apart), and a
prompt with nothing to prefill admitted before the step gives its first token in it.

A chunk's length is `prefill_step_size`, or what a `ChunkSizer` (`_chunking.py`) gives it
while the running batch decodes.

Beside a decoding batch, where the model allows it (`_packed.py`: Llama, Mistral, Qwen2,
Qwen3; no adapters, no speculation), the chunk runs inside the decode step's forward: the
call then admits prompts and plans the chunk before the decode step, and does the chunk's
bookkeeping after it. Otherwise a chunk is launched asynchronously, right after the decode
step (`async_eval`, as the decode step's own): the host goes on to post the step's tokens and
build the next step while the device runs both, and the next step's tokens are read
without waiting for the chunk (the device runs in launch order: the chunk lands before the
step after). mlx-lm's `PromptProcessingBatch.prompt` evaluates each chunk before it
returns and flushes MLX's buffer cache after it, and `_next` flushes it every 512 steps;
here neither happens while sequences run (the engine flushes it when it goes idle,
`Runner.release_idle_responses`). Its cost reaches the sizer through the decode gaps
(`GapMeter`). A chunk with nothing decoding beside it is evaluated at once and timed
directly: nobody waits for it, and the time is exact.

With speculation on, the decode step is `_batch_speculating.BatchSpeculation.decode`'s: a
verify step where a row drafts, else `GenerationBatch.next` as here.

Prompts that all end their prefill together leave the prompt batch whole, without the copy
of its KV that `PromptProcessingBatch.split` makes.

A prompt whose last token fits in its last chunk takes it in that chunk, and its first token
is drawn from that chunk's forward (`_first_tokens.py`) rather than from a forward of its
own as mlx-lm's `generate` runs it; where the model's head cannot be split off
(`model_head`), or `fold_first_tokens` is off, mlx-lm's way is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import attrs
import mlx.core as mx

from ._batch_speculating import BatchSpeculation
from ._chunk_forward import (
    PreparedChunk,
    finish_chunk,
    launch_chunk,
    note_shape,
    prepare_chunk,
)
from ._chunking import ChunkSizer, GapMeter
from ._first_tokens import FirstFromChunk, Head, model_head
from ._packed import PackedForward, packable
from ._upstream import BatchGenerator, PromptProcessingBatch


@attrs.frozen
class _Chunk:
    """A planned prefill chunk: row i of the prompt batch takes `tokens[i]`; `finishing`
    rows end their prompt in it; `decoding`: a running batch decodes beside it."""

    tokens: list[list[int]]
    finishing: list[int]
    decoding: bool

    @property
    def size(self) -> int:
        """Tokens the forward computes, padding included."""
        return len(self.tokens) * max(len(t) for t in self.tokens)


class ServingBatchGenerator(BatchGenerator):  # type: ignore[misc]  # mlx-lm is untyped
    """`BatchGenerator` with the prefill schedule described in this module's docstring."""

    _currently_processing: list[list[Any]]
    """mlx-lm's record per prompt in the prompt batch: [segments left, done, total]."""
    _prompt_batch: Any
    """mlx-lm's `PromptProcessingBatch` of the prompts being prefilled."""

    def __init__(
        self,
        model: Any,
        *,
        chunk_sizer: ChunkSizer | None = None,
        fold_first_tokens: bool = True,
        rows: Callable[[list[int]], AbstractContextManager[None]] | None = None,
        pack_chunks: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self._rows = rows or _no_rows
        """Marks the forwards built in a block as those of the rows given by uid, in batch
        order (the rows' LoRA adapters, `_adapters.py`): every forward here is in one."""
        self._head: Head | None = model_head(model) if fold_first_tokens else None
        """The model's output head, where a prompt's first token comes from its last chunk
        (None: from a forward of its own, as mlx-lm does)."""
        self.chunk_sizer = chunk_sizer
        """Sizes each chunk and is told its time (None: chunks of `prefill_step_size`)."""
        self._gaps = GapMeter(chunk_sizer) if chunk_sizer is not None else None
        """Times the chunks launched beside decoding sequences (None: no sizer to tell)."""
        self.speculation: BatchSpeculation | None = None
        """Runs the decode steps where rows draft (`_batch_speculating.py`; None: off)."""
        self._quiet = False
        """The last call launched no prefill chunk and moved no row in: the next decode
        step's time is its own (speculation's costs learn from it)."""
        self._pack = pack_chunks and rows is None and self._head is not None and packable(model)
        """A chunk beside decoding rows runs in their step's forward (`_packed.py`); never
        with rows marked for adapters (a packed forward is not one batch's rows)."""

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens run in prefill chunks (mlx-lm counts them only privately)."""
        return int(self._counters.prompt_tokens)

    def _next(self) -> tuple[list[Any], list[Any]]:
        prompt_responses: list[Any] = []
        generation_responses: list[Any] = []
        counters = self._counters
        batch = self._generation_batch
        planned: _Chunk | None = None
        packing = (
            self._pack and self.speculation is None and 0 < len(batch) < self.completion_batch_size
        )
        if packing:  # the chunk rides in this decode step: planned before it
            self._admit(prompt_responses)
            planned = self._plan_chunk(prompt_responses, decoding=True)
        packed: tuple[PreparedChunk, PackedForward] | None = None
        if len(self._generation_batch) > 0:
            tic = time.perf_counter()
            with self._rows(list(self._generation_batch.uids)):
                if self.speculation is not None:
                    generation_responses = self.speculation.decode(
                        self._generation_batch, quiet=self._quiet
                    )
                elif planned is not None:
                    packed, generation_responses = self._decode_packed(planned)
                else:
                    generation_responses = self._generation_batch.next()
            toc = time.perf_counter()
            counters.decode_time += toc - tic
            counters.generation_tokens += len(generation_responses)
            counters.generation_steps += 1
            if self._gaps is not None:
                self._gaps.decoded(toc)
        elif self._gaps is not None:
            self._gaps.paused()
        if planned is not None and packed is not None:
            self._finish_packed(planned, *packed, prompt_responses)
            self._admit(prompt_responses)  # into the room the step's finished rows left
        else:
            if len(self._generation_batch) >= self.completion_batch_size:
                self._quiet = True
                return prompt_responses, generation_responses
            self._admit(prompt_responses)
            planned = self._plan_chunk(prompt_responses, decoding=len(self._generation_batch) > 0)
            if planned is not None:
                self._launch_apart(planned, prompt_responses)
        self._start_generating(prompt_responses)
        self._quiet = planned is None and not prompt_responses
        return prompt_responses, generation_responses

    def _admit(self, prompt_responses: list[Any]) -> None:
        """Waiting prompts into the prompt batch, as far as it and the running batch have
        room; prompts with nothing left to prefill (one token, or a cached prefix that covers
        all but the last) go straight to the running batch."""
        room = min(
            self.prefill_batch_size - len(self._prompt_batch),
            self.completion_batch_size - len(self._generation_batch) - len(self._prompt_batch),
            len(self._unprocessed_sequences),
        )
        if room > 0:
            self._prompt_batch.extend(self._make_batch(room))
        self._start_generating(prompt_responses)

    def _plan_chunk(self, prompt_responses: list[Any], *, decoding: bool) -> _Chunk | None:
        """The prompt batch's next chunk (None: no prompt to prefill), taken from the rows'
        segments; each row's progress is in `prompt_responses`."""
        if not self._currently_processing:
            return None
        size = self.prefill_step_size
        if self.chunk_sizer is not None:
            size = self.chunk_sizer.size(len(self._currently_processing), decoding=decoding)
        chunks: list[list[int]] = []
        finishing: list[int] = []
        """Rows whose last token is in this chunk: their first token comes from it."""
        for i, processing in enumerate(self._currently_processing):
            segments = processing[0]
            chunk = segments[0][:size]
            segments[0] = segments[0][len(chunk) :]
            ended = not segments[0]
            if ended:
                segments.pop(0)
                last_fits = len(chunk) < size and len(segments) == 1 and len(segments[0]) == 1
                if self._head is not None and last_fits:
                    chunk = chunk + segments.pop(0)
                    finishing.append(i)
            processing[1] += len(chunk)
            chunks.append(chunk)
            prompt_responses.append(
                PromptProcessingBatch.Response(
                    self._prompt_batch.uids[i], (processing[1], processing[2]), ended, False
                )
            )
        self._counters.prompt_tokens += sum(len(chunk) for chunk in chunks)
        return _Chunk(chunks, finishing, decoding)

    def _launch_apart(self, planned: _Chunk, prompt_responses: list[Any]) -> None:
        """`planned` as a forward of its own (module docstring)."""
        tic = time.perf_counter()
        head = self._head if planned.finishing else None
        with self._rows(list(self._prompt_batch.uids)):
            states, logits = launch_chunk(
                self._prompt_batch, planned.tokens, planned.finishing, head
            )
        if planned.decoding:
            if self._gaps is not None:
                self._gaps.launched(planned.size)
            self._counters.prompt_time += time.perf_counter() - tic  # the rest overlaps
        else:
            mx.eval(states)  # nobody decodes beside it: its time is exact
            elapsed = time.perf_counter() - tic
            self._counters.prompt_time += elapsed
            if self.chunk_sizer is not None:
                self.chunk_sizer.observe(planned.size, elapsed)
        if logits is not None:
            self._start_from_chunk(planned.finishing, logits, prompt_responses)

    def _decode_packed(self, planned: _Chunk) -> tuple[tuple[PreparedChunk, PackedForward], Any]:
        """The running batch's decode step with `planned` in its forward (`_packed.py`)."""
        chunk = prepare_chunk(self._prompt_batch, planned.tokens)
        note_shape(self.model, chunk.inputs, self._prompt_batch.prompt_cache)
        model = getattr(self.model, "unwatched", self.model)
        assert self._head is not None  # `_pack` holds only with one
        packing = PackedForward(model, self._head, chunk.inputs, self._prompt_batch.prompt_cache)
        batch = self._generation_batch
        own = batch.model
        batch.model = packing  # its `_step` calls `self.model(inputs, cache=...)`, once
        try:
            responses = batch.next()
        finally:
            batch.model = own
        return (chunk, packing), responses

    def _finish_packed(
        self,
        planned: _Chunk,
        chunk: PreparedChunk,
        packing: PackedForward,
        prompt_responses: list[Any],
    ) -> None:
        """The chunk's side of a packed step: its caches' padding undone, its states
        launched with the step, its finishing rows moved to the running batch."""
        mx.async_eval(finish_chunk(self._prompt_batch, chunk))  # type: ignore[no-untyped-call]
        if self._gaps is not None:
            self._gaps.launched(planned.size)
        if planned.finishing:
            assert self._head is not None and packing.chunk_hidden is not None
            logits = chunk.last_logits(packing.chunk_hidden, planned.finishing, self._head)
            self._start_from_chunk(planned.finishing, logits, prompt_responses)

    def _leave_prompt_batch(self, rows: list[int]) -> Any:
        """The prompt batch's `rows` as a batch of their own (the whole batch, uncopied,
        when they are all of it); the rest stay."""
        if len(rows) == len(self._currently_processing):
            leaving = self._prompt_batch
            self._prompt_batch = PromptProcessingBatch.empty(
                self.model, self.sampler, prefill_step_size=self.prefill_step_size
            )
            self._currently_processing = []
            return leaving
        chosen = set(rows)
        self._currently_processing = [
            p for i, p in enumerate(self._currently_processing) if i not in chosen
        ]
        return self._prompt_batch.split(rows)

    def _start_from_chunk(
        self, rows: list[int], logits: mx.array, prompt_responses: list[Any]
    ) -> None:
        """Move `rows`, whose last token the chunk just launched carried, into the running
        batch; their first tokens are drawn from `logits` (one row each, in order)."""
        totals = [self._currently_processing[i][2] for i in rows]
        leaving = self._leave_prompt_batch(rows)
        last = [held.pop() for held in leaving.tokens]  # in the KV; `_step` records it
        started = FirstFromChunk(
            self.model,
            leaving.uids,
            mx.array(last),
            leaving.prompt_cache,
            leaving.tokens,
            leaving.samplers,
            leaving.fallback_sampler,
            leaving.logits_processors,
            leaving.stop_sequences,
            leaving.max_tokens,
            logits=logits,
        )
        for uid, total in zip(started.uids, totals, strict=True):
            prompt_responses.append(PromptProcessingBatch.Response(uid, (total, total), True, True))
        self._generation_batch.extend(started)

    def _start_generating(self, prompt_responses: list[Any]) -> None:
        """Move the prompts whose last segment is their last token into the running batch;
        their first token is computed asynchronously and returned by the batch's next decode
        step (in this call, where the chunk rides in the decode step and they moved before
        it)."""
        ready = [
            i
            for i, processing in enumerate(self._currently_processing)
            if len(processing[0]) == 1 and len(processing[0][0]) == 1
        ]
        if not ready:
            return
        last_inputs = [self._currently_processing[i][0][0] for i in ready]
        totals = [self._currently_processing[i][2] for i in ready]
        leaving = self._leave_prompt_batch(ready)
        with self._rows(list(leaving.uids)):
            started = leaving.generate(last_inputs)  # its first step runs the model
        for uid, total in zip(started.uids, totals, strict=True):
            prompt_responses.append(PromptProcessingBatch.Response(uid, (total, total), True, True))
        self._generation_batch.extend(started)


def _no_rows(uids: list[int]) -> AbstractContextManager[None]:
    return nullcontext()
