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
