"""A draft model drafting for the whole running batch at once: each drafted position is one
forward of the draft model for every row, where `_draft_model.ModelDrafter` (the fast path's)
drafts one sequence at a time.

The draft model's KV for the batch's drafting rows is one `RaggedBatchKVCache` per layer
(left-padded rows sharing one write index, as the served batch's). A round (`draft`) first
brings every row's draft KV to its confirmed context:

- rows whose sequence left are filtered out, at the next round (a leave costs nothing until
  then; when the last drafting row leaves, the whole cache is let go at once);
- a row new to the draft batch is prefilled alone (its context but its last token, in chunks
  of `FEED_CHUNK`) and joins by `extend`;
- each row's positions past the longest prefix they share with its context (drafts the
  verify rejected, a guess at a token that was still computing) are trimmed, row by row,
  with the batch's realignment (`_batch_speculating.realign`);
- the tokens each row lacks (the context's last token at least: its logits give the first
  draft) are fed in one right-padded forward, whose padding is dropped the same way.

The other drafts are one-position forwards of the whole batch, greedy, read once at the end.
Every row in the draft batch takes part in every round, those whose control drafts nothing
this step too: what a row lacks then never grows past a few tokens, and a row costs a
forward's width, not a forward. Like `ModelDrafter`'s, the drafts are only guesses: the
verify keeps exactly what plain decoding would give. Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx

from ._draft_model import FEED_CHUNK, shared_prefix
from ._ragged import RaggedBatchKVCache, RowKVCache, ragged_rows, shift_rows
from ._upstream import make_prompt_cache

COMPACT_PADDING = 256
"""Left padding common to every draft row that is dropped (one copy of the draft KV)."""


def batchable(draft_model: Any) -> bool:
    """The draft model's cache is plain KV on every layer, which the ragged batch cache
    batches, trims and realigns (rotating windows or recurrent state draft row by row)."""
    return all(type(layer) is RowKVCache for layer in ragged_rows(make_prompt_cache(draft_model)))


@attrs.frozen
class DraftAsk:
    """What one row asks of a round: drafts after `context` (its confirmed tokens, then its
    next input where `known`), `most` of them; where its next input is still computing
    (`known` None), the draft model's guess at it comes first and is dropped."""

    context: Sequence[int]
    known: int | None
    most: int

    @property
    def length(self) -> int:
        """The tokens the draft model follows: the context, and the next input if known."""
        return len(self.context) + (self.known is not None)

    def tail(self, start: int) -> list[int]:
        """Those tokens from `start` on (only they are copied)."""
        tail = list(self.context[start:])
        return tail if self.known is None else [*tail, self.known]

    @property
    def count(self) -> int:
        """Tokens the round computes for this row (the guess included)."""
        return self.most + (1 if self.known is None and self.most > 0 else 0)


class BatchModelDrafter:
    """The draft model's KV for the batch's drafting rows, and its rounds (module docstring)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._uids: list[int | None] = []
        """Each draft row's sequence (batch uid), None once it left (filtered next round)."""
        self._sure: list[int] = []
        """How many tokens of its context each draft row's KV holds (confirmed: the context
        only grows)."""
        self._fed: list[list[int]] = []
        """The drafts each row's KV holds after them (the last round's, maybe rejected since):
        only these are compared with the context."""
        self._cache: list[RaggedBatchKVCache] | None = None

    @property
    def uids(self) -> frozenset[int]:
        return frozenset(uid for uid in self._uids if uid is not None)

    def drop(self, uid: int) -> None:
        """`uid` left the batch: its draft row goes at the next round (all at once now if it
        was the last)."""
        if uid in self._uids:
            self._uids[self._uids.index(uid)] = None
        if not self.uids:
            self.clear()

    def clear(self) -> None:
        self._uids, self._sure, self._fed, self._cache = [], [], [], None

    def draft(self, asks: dict[int, DraftAsk]) -> dict[int, list[int]]:
        """Each row's drafts (`asks` by uid: every row that drafts with this model, in any
        order; a row may ask none and still catches up). Waits for them (one read)."""
        self._keep(set(asks))
        self._join([uid for uid in asks if uid not in self._uids], asks)
        cache = self._cache
        assert cache is not None
        order = [uid for uid in self._uids if uid is not None]
        asked = [asks[uid] for uid in order]
        shared = [
            min(sure + shared_prefix(fed, ask.tail(sure)), ask.length - 1)
            for ask, sure, fed in zip(asked, self._sure, self._fed, strict=True)
        ]
        surplus = [
            sure + len(fed) - n for sure, fed, n in zip(self._sure, self._fed, shared, strict=True)
        ]
        _drop_last(cache, surplus)
        pending = [ask.tail(n) for ask, n in zip(asked, shared, strict=True)]
        while max(map(len, pending)) > FEED_CHUNK:
            pieces = [p[: min(FEED_CHUNK, len(p) - 1)] for p in pending]
            _feed(self._model, cache, pieces)
            pending = [p[len(piece) :] for p, piece in zip(pending, pieces, strict=True)]
        steps = max(ask.count for ask in asked)
        token = mx.argmax(_feed(self._model, cache, pending), axis=-1)
        mx.async_eval(token)  # type: ignore[no-untyped-call]  # runs while the next is built
        drafted = [token]
        for _ in range(steps - 1):
            logits = self._model(token[:, None], cache=cache)
            token = mx.argmax(logits[:, -1, :], axis=-1)
            mx.async_eval(token)  # type: ignore[no-untyped-call]
            drafted.append(token)
        listed: list[list[int]] = mx.stack(drafted, axis=1).tolist()  # type: ignore[assignment]
        drafts: dict[int, list[int]] = {}
        for i, (uid, ask) in enumerate(zip(order, asked, strict=True)):
            row = [int(t) for t in listed[i]]
            self._sure[i], self._fed[i] = ask.length, row[:-1]  # the last draft was not fed
            drafts[uid] = row[: ask.count][ask.count - ask.most :]
        _compact(cache)
        return drafts

    def _keep(self, live: set[int]) -> None:
        """Filter out the draft rows whose sequence left or drafts no more."""
        keep = [i for i, uid in enumerate(self._uids) if uid is not None and uid in live]
        if len(keep) == len(self._uids):
            return
        if not keep:
            self.clear()
            return
        assert self._cache is not None
        for layer in self._cache:
            layer.filter(keep)
        self._uids = [self._uids[i] for i in keep]
        self._sure = [self._sure[i] for i in keep]
        self._fed = [self._fed[i] for i in keep]

    def _join(self, uids: list[int], asks: dict[int, DraftAsk]) -> None:
        """Prefill each new row alone (its context but the last token) and add them."""
        if not uids:
            return
        rows: list[list[Any]] = []
        for uid in uids:
            context = asks[uid].tail(0)[:-1]
            row = ragged_rows(make_prompt_cache(self._model))
            for start in range(0, len(context), FEED_CHUNK):
                self._model(mx.array([context[start : start + FEED_CHUNK]]), cache=row)
                mx.eval([layer.state for layer in row])
            rows.append(row)
            self._uids.append(uid)
            self._sure.append(len(context))
            self._fed.append([])
        joined = [RaggedBatchKVCache.merge(list(layers)) for layers in zip(*rows, strict=True)]
        if self._cache is None:
            self._cache = joined
        else:
            for layer, new in zip(self._cache, joined, strict=True):
                layer.extend(new)


def _feed(model: Any, cache: list[RaggedBatchKVCache], pieces: list[list[int]]) -> mx.array:
    """One forward of each row's `pieces[i]` (right-padded to the longest), the padding then
    dropped from the KV; the logits at each row's last real position (a row with no piece:
    its padding's, unused)."""
    width = max(map(len, pieces))
    padded = [piece + [0] * (width - len(piece)) for piece in pieces]
    logits: mx.array = model(mx.array(padded), cache=cache)
    last = mx.array([max(len(piece) - 1, 0) for piece in pieces])
    chosen = logits[mx.arange(len(pieces)), last]
    _drop_last(cache, [width - len(piece) for piece in pieces])
    return chosen


def _drop_last(cache: list[RaggedBatchKVCache], counts: list[int]) -> None:
    """Drop each row i's last `counts[i]` positions: the shared index is trimmed by the
    fewest, and each row that drops more moves right by the difference."""
    fewest = min(counts)
    if fewest > 0:
        for layer in cache:
            layer.trim(fewest)
    shift_rows(cache, [count - fewest for count in counts])


def _compact(cache: list[RaggedBatchKVCache]) -> None:
    """Drop the padding every row has, once it reaches `COMPACT_PADDING` (rows moved right by
    realignment pad the buffer, which each forward's attention reads)."""
    if cache and min(cache[0].padding, default=0) >= COMPACT_PADDING:
        every = list(range(len(cache[0].padding)))
        for layer in cache:
            layer.filter(every)
