"""A prefill chunk's forward on a prompt batch (mlx-lm's `PromptProcessingBatch`), in two
halves around the model's pass: `prepare_chunk` pads the rows' chunks to one length and tells
the caches, `finish_chunk` undoes the padding in them. `launch_chunk` runs the pass between
them as a forward of its own; `_packed.py` runs it inside a decode step's. Lazy, launched
with `async_eval` (`_schedule.py` says why); engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ._first_tokens import Head, last_logits


def launch_chunk(
    batch: Any, tokens: list[list[int]], finishing: Sequence[int] = (), head: Head | None = None
) -> tuple[list[Any], mx.array | None]:
    """Run one chunk of `batch`'s prompts (a `PromptProcessingBatch`; row i takes
    `tokens[i]`) through the model as its `prompt` does, but launched with `async_eval`
    and without flushing MLX's buffer cache; returns the cache states it computes (to
    evaluate, where the caller must wait) and, with a `head`, the logits at the last token
    of the rows `finishing` (lazy; None without). Every row's chunk must fit one forward
    pass: `prefill_step_size` tokens at most."""
    chunk = prepare_chunk(batch, tokens)
    logits = None
    if head is None:
        batch.model(chunk.inputs, cache=batch.prompt_cache)
    else:
        note_shape(batch.model, chunk.inputs, batch.prompt_cache)
        hidden = batch.model.model(chunk.inputs, cache=batch.prompt_cache)
        logits = chunk.last_logits(hidden, finishing, head)
    states = finish_chunk(batch, chunk)
    mx.async_eval(states)  # type: ignore[no-untyped-call]
    return states, logits


def note_shape(model: Any, inputs: mx.array, cache: list[Any]) -> None:
    """Tell the engine's `ShapeWatch` (if `model` is one) of a prefill forward that runs the
    model's parts rather than the model (its call notes the others itself)."""
    note = getattr(model, "note", None)
    if note is not None:
        note(inputs, cache)


class PreparedChunk:
    """A chunk's padded inputs, with its caches prepared for them (`prepare_chunk`)."""

    def __init__(self, inputs: mx.array, lengths: list[int], padded: bool) -> None:
        self.inputs = inputs
        self.lengths = lengths
        self.padded = padded

    def last_logits(self, hidden: mx.array, finishing: Sequence[int], head: Head) -> mx.array:
        """The logits at the last token of the rows `finishing`, from the chunk's hidden
        states."""
        rows = list(finishing)
        return last_logits(hidden, rows, [self.lengths[i] - 1 for i in rows], head)


def prepare_chunk(batch: Any, tokens: list[list[int]]) -> PreparedChunk:
    """The first half of a chunk's forward: `batch`'s rows take `tokens` (row i `tokens[i]`,
    each at most `prefill_step_size`), padded on the right to one length, its caches told of
    the padding. The forward, then `finish_chunk`, must follow."""
    if len(batch.uids) != len(tokens):
        raise ValueError("the batch length doesn't match the number of inputs")
    if max(len(t) for t in tokens) > batch.prefill_step_size:
        raise ValueError("a chunk is longer than the batch's prefill_step_size")
    for held, chunk in zip(batch.tokens, tokens, strict=True):
        held += chunk  # the tokens its KV cache holds, as `prompt` keeps them
    lengths = [len(t) for t in tokens]
    longest = max(lengths)
    padding = [longest - length for length in lengths]
    padded = max(padding) > 0
    if padded:
        inputs = mx.array([t + [0] * (longest - len(t)) for t in tokens])
        for cache in batch.prompt_cache:
            cache.prepare(lengths=lengths, right_padding=padding)
    else:
        inputs = mx.array(tokens)
    return PreparedChunk(inputs, lengths, padded)


def finish_chunk(batch: Any, chunk: PreparedChunk) -> list[Any]:
    """The second half: the padding undone in `batch`'s caches after the chunk's forward;
    returns the cache states the forward computes (lazy)."""
    if chunk.padded:
        for cache in batch.prompt_cache:
            cache.finalize()
    return [cache.state for cache in batch.prompt_cache]
