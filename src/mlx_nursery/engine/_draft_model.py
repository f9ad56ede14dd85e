"""Drafting by a second, smaller model sharing the served model's tokenizer.

`ModelDrafter` answers the fast path's drafting questions (`extend`, `draft`) as
`_drafting.NgramIndex` does, from a draft model instead of the sequence's own n-grams: it
runs the draft model greedily from the sequence's context for the tokens asked. Its KV
cache follows the sequence: before drafting, whatever it holds past the longest prefix it
shares with the sequence's confirmed context (rejected drafts, a guess at a token still
computing) is trimmed away, and the confirmed tokens it lacks are fed in chunks. The drafts
are only guesses: the verify step keeps exactly what plain decoding would give
(`_speculating.py`), so the draft model changes speed, never output.

Drafting runs on the engine thread (every MLX call of a model does): a draft of k tokens is
k forwards of the draft model, launched together and read once. Engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import mlx.core as mx

from ..models import LoadedModel, load_model
from ._config import EngineConfig
from ._upstream import make_prompt_cache, trim_prompt_cache

log = logging.getLogger("mlx_nursery.engine")

FEED_CHUNK = 512
"""Context tokens the draft model takes in one forward while it catches up (bounds the
attention's memory on a long prompt, as prefill chunks do)."""


class DraftModelMismatch(ValueError):
    """The draft model cannot draft for the served model: their tokenizers differ."""


def check_draft_model(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Refuse a draft model whose tokenizer is not the served model's (the same vocabulary,
    token for token): its tokens would mean other text. Raises `DraftModelMismatch`."""
    if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise DraftModelMismatch(
            "the draft model's tokenizer differs from the served model's: a draft model must "
            "share its vocabulary (the same family and tokenizer)"
        )


def with_draft_model(model: LoadedModel, config: EngineConfig) -> LoadedModel:
    """`model` with its draft model loaded beside it, where `config`'s speculation asks for
    one (the worker calls this before measuring the KV budget: the draft's weights count as
    the served model's do). Raises `DraftModelMismatch` for a draft model that is no text
    model or has another vocabulary. Engine thread (it loads a model)."""
    spec = config.speculation
    if spec is None or spec.draft_model is None or model.kind != "lm":
        return model
    if config.distribution is not None:
        return model  # the fast path, where drafts run, is off across devices
    draft = load_model(spec.draft_model, fuse_weights=config.fuse_weights)
    if draft.kind != "lm" or draft.model is None:
        raise DraftModelMismatch(f"the draft model is not a text model ({draft.kind})")
    check_draft_model(model.tokenizer, draft.tokenizer)
    log.info("speculative decoding drafts with %s", draft.path.name)
    return attrs.evolve(model, draft=draft.model)


class ModelDrafter:
    """One sequence's drafts from a draft model (module docstring)."""

    def __init__(self, model: Any, context: Iterable[int]) -> None:
        self._model = model
        self._context: list[int] = list(context)
        """The sequence's confirmed tokens."""
        self._cache = make_prompt_cache(model)
        self._cached: list[int] = []
        """The tokens the draft cache holds, in order."""
        self._sure = 0
        """How many of them are context (the context only grows): only those after them
        are compared with it."""

    def __len__(self) -> int:
        return len(self._context)

    def extend(self, tokens: Iterable[int]) -> None:
        """The sequence confirmed `tokens` (they follow its context)."""
        self._context.extend(tokens)

    def draft(self, most: int) -> list[int]:
        """The draft model's `most` greedy tokens after the context (empty for an empty
        context). Waits for them (one read of all)."""
        if most <= 0 or not self._context:
            return []
        sure = self._sure
        shared = sure + shared_prefix(self._cached[sure:], self._context[sure:])
        # The last context token is fed again if held: its logits give the first draft.
        shared = min(shared, len(self._context) - 1)
        surplus = len(self._cached) - shared
        if surplus > 0:
            trim_prompt_cache(self._cache, surplus)
        del self._cached[shared:]
        pending = self._context[shared:]
        while len(pending) > FEED_CHUNK:
            self._model(mx.array([pending[:FEED_CHUNK]]), cache=self._cache)
            mx.eval([c.state for c in self._cache])
            self._cached += pending[:FEED_CHUNK]
            pending = pending[FEED_CHUNK:]
        logits = self._model(mx.array([pending]), cache=self._cache)
        self._cached += pending
        self._sure = len(self._context)
        token = mx.argmax(logits[:, -1, :], axis=-1)
        mx.async_eval(token)  # type: ignore[no-untyped-call]  # runs while the next is built
        drafted = [token]
        for _ in range(most - 1):
            logits = self._model(token[:, None], cache=self._cache)
            token = mx.argmax(logits[:, -1, :], axis=-1)
            mx.async_eval(token)  # type: ignore[no-untyped-call]
            drafted.append(token)
        listed = mx.concatenate(drafted).tolist()
        assert isinstance(listed, list)
        tokens = [int(t) for t in listed]  # type: ignore[arg-type]
        self._cached += tokens[:-1]  # the last draft was not fed
        return tokens


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
