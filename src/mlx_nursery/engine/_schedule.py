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
prompt's first token comes one call after its last chunk.

A chunk's length is `prefill_step_size`, or what a `ChunkSizer` (`_chunking.py`) gives it
while the running batch decodes; each chunk's measured time goes back to the sizer.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx

from ._chunking import ChunkSizer
from ._upstream import BatchGenerator, PromptProcessingBatch


class ServingBatchGenerator(BatchGenerator):  # type: ignore[misc]  # mlx-lm is untyped
    """`BatchGenerator` with the prefill schedule described in this module's docstring."""

    _currently_processing: list[list[Any]]
    """mlx-lm's record per prompt in the prompt batch: [segments left, done, total]."""

    def __init__(self, model: Any, *, chunk_sizer: ChunkSizer | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.chunk_sizer = chunk_sizer
        """Sizes each chunk and is told its time (None: chunks of `prefill_step_size`)."""

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens run in prefill chunks (mlx-lm counts them only privately)."""
        return int(self._counters.prompt_tokens)

    def _next(self) -> tuple[list[Any], list[Any]]:
        prompt_responses: list[Any] = []
        generation_responses: list[Any] = []
        counters = self._counters
        if len(self._generation_batch) > 0:
            tic = time.perf_counter()
            generation_responses = self._generation_batch.next()
            counters.decode_time += time.perf_counter() - tic
            counters.generation_tokens += len(generation_responses)
            counters.generation_steps += 1
            if counters.generation_steps % 512 == 0:
                mx.clear_cache()  # as mlx-lm does: the allocator's cache grows with shapes
        if len(self._generation_batch) >= self.completion_batch_size:
            return prompt_responses, generation_responses

        room = min(
            self.prefill_batch_size - len(self._prompt_batch),
            self.completion_batch_size - len(self._generation_batch) - len(self._prompt_batch),
            len(self._unprocessed_sequences),
        )
        if room > 0:
            self._prompt_batch.extend(self._make_batch(room))
        # Prompts with nothing left to prefill (one token, or a cached prefix that covers
        # all but the last) go straight to the running batch.
        self._start_generating(prompt_responses)

        size = self.prefill_step_size
        if self.chunk_sizer is not None and self._currently_processing:
            decoding = len(self._generation_batch) > 0
            size = self.chunk_sizer.size(len(self._currently_processing), decoding=decoding)
        chunks: list[list[int]] = []
        for i, processing in enumerate(self._currently_processing):
            segments = processing[0]
            chunk = segments[0][:size]
            segments[0] = segments[0][len(chunk) :]
            ended = not segments[0]
            if ended:
                segments.pop(0)
            processing[1] += len(chunk)
            chunks.append(chunk)
            prompt_responses.append(
                PromptProcessingBatch.Response(
                    self._prompt_batch.uids[i], (processing[1], processing[2]), ended, False
                )
            )
        counters.prompt_tokens += sum(len(chunk) for chunk in chunks)
        tic = time.perf_counter()
        self._prompt_batch.prompt(chunks)  # evaluated before it returns: the time is real
        elapsed = time.perf_counter() - tic
        counters.prompt_time += elapsed
        if self.chunk_sizer is not None and chunks:
            self.chunk_sizer.observe(len(chunks) * max(len(c) for c in chunks), elapsed)

        self._start_generating(prompt_responses)
        return prompt_responses, generation_responses

    def _start_generating(self, prompt_responses: list[Any]) -> None:
        """Move the prompts whose last segment is their last token into the running batch;
        their first token is computed asynchronously and returned by the next decode step."""
        ready = [
            i
            for i, processing in enumerate(self._currently_processing)
            if len(processing[0]) == 1 and len(processing[0][0]) == 1
        ]
        if not ready:
            return
        last_inputs = [self._currently_processing[i][0][0] for i in ready]
        totals = [self._currently_processing[i][2] for i in ready]
        self._currently_processing = [
            p for i, p in enumerate(self._currently_processing) if i not in set(ready)
        ]
        started = self._prompt_batch.split(ready).generate(last_inputs)
        for uid, total in zip(started.uids, totals, strict=True):
            prompt_responses.append(PromptProcessingBatch.Response(uid, (total, total), True, True))
        self._generation_batch.extend(started)
