"""A logits processor that holds one sequence to a grammar: an llguidance matcher over MLX.

It lives in the engine because it runs on the engine thread and touches MLX; the OpenAI layer
compiles the grammar (llguidance alone) and hands the matcher over in a `GenerationRequest`.
"""

from __future__ import annotations

from typing import Any

import llguidance.numpy as lnp
import mlx.core as mx
import numpy as np


class GrammarProcessor:
    """A logits processor driving one llguidance matcher; one instance per request.

    Its matcher follows the context it is given, not a count of calls: the first call's
    context is the prompt, and every later token in the context is one the grammar must
    accept. The engine may replay a sequence after a failed batch step, dropping a token
    the matcher already took; the matcher then rolls back to the context.
    """

    def __init__(self, matcher: Any, vocab_size: int, param: str | None = None) -> None:
        self.param = param
        """The request field the grammar enforces (for errors)."""
        self.failure: str | None = None
        """Why the matcher stopped, if it did: the grammar could not be followed (llguidance's
        parser limits, a schema it cannot complete), which is the request's doing."""
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._bitmask = lnp.allocate_token_bitmask(1, vocab_size)
        self._prompt_length: int | None = None
        self._consumed = 0

    def begin_at(self, prompt_length: int) -> None:
        """Hold the tokens after `prompt_length` to the grammar (a `ThinkingGate` moves the
        start past the thinking); a different start than before resets the matcher."""
        if self._prompt_length is not None and self._prompt_length != prompt_length:
            self._matcher.reset()
            self._consumed = 0
        self._prompt_length = prompt_length

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._prompt_length is None:
            self._prompt_length = int(tokens.size)
        generated = int(tokens.size) - self._prompt_length
        if generated < self._consumed:  # a replay dropped tokens the matcher took
            self._matcher.rollback(self._consumed - generated)
            self._consumed = generated
        if generated > self._consumed:
            new = tokens[self._prompt_length + self._consumed :].tolist()
            if not self._matcher.consume_tokens(new):
                self.failure = self._matcher.get_error()
                raise RuntimeError(f"constrained decoding diverged: {self.failure}")
            self._consumed = generated
        lnp.fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        vocab = logits.shape[-1]
        allowed = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[:vocab]
        if allowed.shape[0] < vocab:  # ids past the tokenizer's vocabulary (padding) never fit
            allowed = np.concatenate([allowed, np.zeros(vocab - allowed.shape[0], np.uint8)])
        mask = mx.array(allowed.astype(bool))
        return mx.where(mask, logits, mx.array(-mx.inf, logits.dtype))


class ThinkingGate:
    """A grammar that holds only the answer of a thinking model: the thinking runs free.

    The output may open a think block with its first token (`start_id`), or begins inside
    one when the prompt opened it (`opened`); the grammar then applies from the token after
    `end_id`. Before the output has chosen, the grammar's first tokens and the start marker
    are allowed; while thinking, anything but an end of sequence (`eos_ids`): a request for
    a format or a call gets its answer, unless the token budget runs out first.

    Like the processor it gates, it follows the context it is given (replays included)."""

    def __init__(
        self,
        grammar: GrammarProcessor,
        start_id: int,
        end_id: int,
        eos_ids: frozenset[int],
        *,
        opened: bool,
    ) -> None:
        self._grammar = grammar
        self._start_id, self._end_id = start_id, end_id
        self._eos = sorted(eos_ids)
        self._opened = opened
        self._prompt_length: int | None = None
        self._scanned = 0
        self._state = "thinking" if opened else "start"
        self._eos_mask: mx.array | None = None
        self._answer_at = 0
        """Where the answer begins, in generated tokens (once `_state` is "answer")."""

    @property
    def param(self) -> str | None:
        return self._grammar.param

    @property
    def failure(self) -> str | None:
        return self._grammar.failure

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._prompt_length is None:
            self._prompt_length = int(tokens.size)
        generated = int(tokens.size) - self._prompt_length
        if generated < self._scanned:  # a replay from before what was read: read again
            self._state, self._scanned = ("thinking" if self._opened else "start"), 0
        if self._state != "answer" and generated > self._scanned:
            new: list[int] = tokens[self._prompt_length + self._scanned :].tolist()  # type: ignore[assignment]
            for offset, token in enumerate(new):
                self._read(int(token), self._scanned + offset)
                if self._state == "answer":
                    break
            self._scanned = generated
        if self._state == "thinking":
            return self._without_eos(logits)
        self._grammar.begin_at(self._prompt_length + self._answer_at)
        held = self._grammar(tokens, logits)
        if self._state == "start":  # the first token may also open the thinking
            opens = mx.arange(logits.shape[-1]) == self._start_id
            return mx.where(opens, logits, held)
        return held

    def _read(self, token: int, index: int) -> None:
        if self._state == "start":
            if token == self._start_id:
                self._state = "thinking"
            else:
                self._state, self._answer_at = "answer", index
        elif self._state == "thinking" and token == self._end_id:
            self._state, self._answer_at = "answer", index + 1

    def _without_eos(self, logits: mx.array) -> mx.array:
        vocab = logits.shape[-1]
        if self._eos_mask is None or self._eos_mask.shape[0] != vocab:
            mask = np.zeros(vocab, bool)
            mask[[t for t in self._eos if t < vocab]] = True
            self._eos_mask = mx.array(mask)
        return mx.where(self._eos_mask, mx.array(-mx.inf, logits.dtype), logits)
