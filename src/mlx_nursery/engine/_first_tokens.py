"""A prompt's first token from its last prefill chunk, not from a forward of its own.

mlx-lm's batch prefills every prompt token but the last, then runs the last token through
the model alone (`PromptProcessingBatch.generate` -> `GenerationBatch.__init__`) for the
logits of the first token: a whole forward for a few rows, launched once for every group of
prompts that joins the running batch. On a GPU whose step is bound by launching kernels,
that forward cost about as much host time as a decode step of the full batch
(`bench/step_anatomy.py`, the "first" phase).

Here, where a prompt's last token fits in its last chunk, the chunk carries it: the model's
body runs the chunk once, and its head is applied only to the hidden state at each
finishing row's last token (a few rows, not the chunk's every position). The first token is
then drawn exactly as `GenerationBatch._step` draws it (logits processors, normalization,
the rows' samplers), by `FirstFromChunk`, whose first step takes those logits instead of
running the model. Architectures whose model is not `head(body(...))` as read here keep
mlx-lm's way (`model_head` returns None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from ._upstream import GenerationBatch

Head = Callable[[mx.array], mx.array]
"""Final hidden states (rows, 1, hidden) -> logits (rows, 1, vocab)."""

HEAD_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3", "ministral3"})
"""mlx-lm model types whose `Model.__call__` is `head(self.model(inputs, cache))`, the head
being `lm_head` or, with tied embeddings, `model.embed_tokens.as_linear` (mlx-lm 0.32.2;
tests/engine/test_first_tokens.py compares the split with the whole model)."""


def model_head(model: Any) -> Head | None:
    """`model`'s output head, for a model whose forward is its body (`model.model`) then
    this head; None for any other (its prompts' first tokens take mlx-lm's own forward)."""
    args = getattr(model, "args", None)
    if getattr(args, "model_type", None) not in HEAD_ARCHITECTURES:
        return None
    if not hasattr(model, "model"):
        return None
    if getattr(args, "tie_word_embeddings", False):
        embedding = model.model.embed_tokens
        return lambda hidden: embedding.as_linear(hidden)
    lm_head = getattr(model, "lm_head", None)
    return None if lm_head is None else lambda hidden: lm_head(hidden)


def last_logits(hidden: mx.array, rows: list[int], positions: list[int], head: Head) -> mx.array:
    """Logits (len(rows), vocab) at `positions` of `rows` of a chunk's hidden states
    (batch, length, hidden): the head runs on those positions only."""
    picked = hidden[mx.array(rows), mx.array(positions)]
    logits: mx.array = head(picked[:, None, :])
    return logits[:, -1, :]


def apply_processors(
    logits: mx.array, inputs: mx.array, processors: Sequence[Any], token_context: Sequence[Any]
) -> tuple[mx.array, list[mx.array]]:
    """Each row's logits processors on its logits, as `GenerationBatch._step` applies them:
    the row's token context takes its input first. Returns the logits and the contexts
    updated (to evaluate with the step). Lazy; engine thread."""
    held: list[mx.array] = []
    rows = []
    for e, row_processors in enumerate(processors):
        row = logits[e : e + 1]
        if row_processors:
            context = token_context[e].update_and_fetch(inputs[e : e + 1])
            held.append(context)
            for processor in row_processors:
                row = processor(context, row)
        rows.append(row)
    return mx.concatenate(rows, axis=0), held


class FirstFromChunk(GenerationBatch):  # type: ignore[misc]  # mlx-lm is untyped
    """A `GenerationBatch` of prompts whose last token ran in their last prefill chunk: built
    with those tokens as `inputs` (they are in the KV cache already, not in `tokens`), its
    first step draws from `logits` (rows in order) instead of running the model; every later
    step is mlx-lm's. Engine thread only."""

    _next_tokens: mx.array
    _next_logprobs: list[mx.array]
    _current_tokens: mx.array
    _current_logprobs: list[mx.array]

    def __init__(self, *args: Any, logits: mx.array, **kwargs: Any) -> None:
        self._chunk_logits: mx.array | None = logits
        super().__init__(*args, **kwargs)  # runs the first step: `_step` below

    def _step(self) -> tuple[list[int], list[mx.array]]:
        logits = self._chunk_logits
        if logits is None:
            return super()._step()  # type: ignore[no-any-return]
        self._chunk_logits = None
        # mlx-lm 0.32.2's `GenerationBatch._step` from its forward on, as it is
        # (tests/engine/test_upstream_contract.py pins that function).
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens
        token_context: list[mx.array] = []
        if any(self.logits_processors):
            logits, token_context = apply_processors(
                logits, inputs, self.logits_processors, self._token_context
            )
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samplers = [
            self.fallback_sampler if s is None else s
            for s in (self.samplers or [None] * len(self.uids))
        ]
        if not samplers or all(s is samplers[0] for s in samplers):
            sampled = (samplers[0] if samplers else self.fallback_sampler)(logprobs)
        else:
            sampled = mx.concatenate(
                [s(logprobs[e : e + 1]) for e, s in enumerate(samplers)], axis=0
            )
        self._next_tokens = sampled
        self._next_logprobs = list(logprobs)
        mx.async_eval(self._next_tokens, self._next_logprobs, token_context)  # type: ignore[no-untyped-call]
        mx.eval(inputs, self._current_logprobs)
        listed = inputs.tolist()
        assert isinstance(listed, list)
        for held, token in zip(self.tokens, listed, strict=True):
            held.append(token)
        return listed, self._current_logprobs  # type: ignore[return-value]
