"""Speculative decoding inside the running batch: each row verifies its own drafts in one
batched forward with the others.

A verify step replaces one of mlx-lm's decode steps (`GenerationBatch.next`, pinned at
0.32.2) where some row drafts: every row feeds its next input (the token plain decoding
would feed now) and its drafts, right-padded to the step's longest draft, in one forward on
the batch's KV. Each drafting row's positions are drawn exactly as plain decoding would draw
them (`PositionDraws`: the same key per position; greedy, the argmax), and its drafts are
kept up to the first that differs from its position's draw, as on the fast path
(`_speculating.py`, decisions/0039): the tokens are plain decoding's. Rows without drafts
(none found, paused, logits processors, a sampler not ours) draw their first position as a
plain step does (`sample_batch`, their processors applied to it), so a row with a grammar or
penalties decodes beside drafting rows unchanged. Stop tokens and `max_tokens` cut a row's
kept tokens, token by token, as `next` checks them.

The batch's KV (`_ragged.RaggedBatchKVCache`, left-padded rows sharing one write index)
then holds each row's kept positions followed by its rejected ones. It is realigned as
mlx-lm realigns a right-padded prefill chunk, but cheaper: the shared index is trimmed to
the most positions any row kept, and each row that kept fewer is moved right by the
difference, its left padding growing by as much (`_ragged.shift_rows`: only the moving
rows' tokens are copied, in place, where mlx-lm's `finalize` gathers every row's buffer).
No rejected position stays in any row's KV, so nothing extracted for the prefix cache holds
a draft it did not keep. A step where no row drafts is
mlx-lm's `next` itself: the same launches, pipelined as ever.

A verify step is read before it returns (its tokens decide the next inputs), so no verify
is ever in flight between steps: a cancel, a leave or a join happens between steps, on a
batch in plain decoding's state; the only state kept across steps is each row's drafter
(`rows`, which the invariant checker holds to the batch's rows) and the next inputs the
last verify read (`_known`). Engine thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import mlx.core as mx

from ._batch_drafting import BatchCosts, RowDrafter, fair, row_drafter
from ._batch_model_drafting import BatchModelDrafter, DraftAsk, batchable
from ._drafting import EXPLORE_DRAFTS, FIRST_PAUSE, LONGEST_PAUSE, Speculation
from ._first_tokens import apply_processors
from ._ragged import RaggedBatchKVCache, shift_rows
from ._sampling import Sampler, sample_batch, sample_rows
from ._sequence import LiveSequence

Report = Callable[[LiveSequence, int, int], None]

RETRY_GAP = 32
"""Steps between tries against costs that say drafts do not pay, counted from the last try
(or the start: costs that turn to no after a longer stretch get a try at once); doubled
after each, up to `LONGEST_PAUSE`: a try drafts one token, so where drafts truly do not pay
the tries cost a small share of the steps."""


def speculable(cache: list[Any]) -> bool:
    """Every layer is a ragged batch cache, which trims and realigns exactly (quantized
    batch caches and other kinds decode without drafts)."""
    return bool(cache) and all(type(layer) is RaggedBatchKVCache for layer in cache)


class BatchSpeculation:
    """The running batch's drafting rows and its verify steps (module docstring)."""

    def __init__(
        self,
        spec: Speculation,
        model: Any,
        samplers: dict[int, Sampler],
        report: Report | None = None,
        draft_model: Any = None,
    ) -> None:
        self._spec = spec
        self._model = getattr(model, "unwatched", model)  # verifies are not prefill shapes
        self._samplers = samplers
        """Each row's sampler by uid (the batch stepper's): rows without drafts draw by it."""
        self._report = report
        self._draft_model = draft_model
        self._model_drafter = (
            BatchModelDrafter(draft_model)
            if draft_model is not None and batchable(draft_model)
            else None
        )
        """Drafts for every row at once, where the draft model's cache batches."""
        self.costs = BatchCosts()
        self._rows: dict[int, RowDrafter] = {}
        self._known: dict[int, int] = {}
        """Rows' next inputs as the last step, a verify, read them (a plain step's are still
        computing when the next step starts: its drafts are looked up one token earlier)."""
        self._since_try = FIRST_PAUSE
        self._try_gaps: dict[int, int] = {}
        """Steps since the last try that measures an unknown verify cost, and by batch size
        (`BatchCosts.size`, whose costs are measured apart) the steps its next try waits:
        doubled after each untimed one, since a never quiet batch measures none."""
        self._since_retry = 0
        self._retry_gap = RETRY_GAP
        """The same for tries while the costs say drafts do not pay (they may have been
        measured under a stall); back to the first gap once drafts pay (the count goes on)."""
        self._was_quiet = False
        self._last_read: float | None = None
        self._last_kind: Literal["plain", "verify"] | None = None
        self._last_rows = 0

    def add(self, uid: int, sequence: LiveSequence) -> None:
        drafter = row_drafter(
            self._spec,
            sequence,
            self.costs,
            self._report,
            self._draft_model,
            batched=self._model_drafter is not None,
        )
        if drafter is not None:
            self._rows[uid] = drafter

    def drop(self, uid: int) -> None:
        self._rows.pop(uid, None)
        self._known.pop(uid, None)
        if self._model_drafter is not None:
            self._model_drafter.drop(uid)

    def clear(self) -> None:
        self._rows.clear()
        self._known.clear()
        if self._model_drafter is not None:
            self._model_drafter.clear()

    @property
    def rows(self) -> frozenset[int]:
        """The rows that may draft (uids), each with its drafter, and those whose draft KV
        the batch's draft model holds (the invariant checker holds both to the batch's)."""
        held = frozenset() if self._model_drafter is None else self._model_drafter.uids
        return frozenset(self._rows) | held

    def decode(self, batch: Any, *, quiet: bool) -> list[Any]:
        """One decode step of `batch` (mlx-lm's `GenerationBatch`): a verify step where a row
        drafts, else `batch.next()`. `quiet`: nothing but this batch's steps ran since the
        last one (no prefill chunk, no join), so its time is a step's cost."""
        rows = len(batch.uids)
        self._since_try += 1
        self._since_retry += 1
        planning = time.perf_counter()
        drafts = self._plan(batch) if self._rows else None
        if drafts is None:
            planned = time.perf_counter() - planning  # drafts looked up but not used
            responses: list[Any] = batch.next()
            self._timed("plain", rows, 0, quiet, spent=planned)
            self._known.clear()
            return responses
        return self._verify(batch, drafts, quiet)

    def _plan(self, batch: Any) -> list[list[int]] | None:
        """Each row's drafts for this step (batch order), or None for a plain step. The
        step's length is chosen before any row drafts, so that a draft model runs only for
        drafts the step will carry."""
        size = BatchCosts.size(len(batch.uids))
        costs = self.costs.select(len(batch.uids))  # the rows' controls ask about this size
        adaptive = self._spec.adaptive
        if not speculable(batch.prompt_cache):
            return None
        wanted: list[int] = []
        acceptances: list[float | None] = []
        for i, uid in enumerate(batch.uids):
            drafter = self._rows.get(uid)
            if drafter is None:
                wanted.append(0)
                acceptances.append(None)
                continue
            room = batch.max_tokens[i] - batch._num_tokens[i] - 1
            wanted.append(max(0, min(drafter.control.drafts(), room)))
            acceptances.append(drafter.control.acceptance)
        if not any(wanted):
            return None
        trying: Literal["first", "again"] | None = None
        longest = max(wanted)
        if adaptive and not costs.measured:  # a try, to measure: spaced out
            if self._since_try < self._try_gaps.get(size, FIRST_PAUSE):
                return None
            trying, longest = "first", EXPLORE_DRAFTS
        elif adaptive:
            longest = max(map(len, fair([[0] * n for n in wanted], acceptances, costs)))
            if not longest:
                # The costs say no: still try now and then, spaced out, so that costs
                # measured under a stall cannot stop the batch drafting for good.
                if self._since_retry < self._retry_gap:
                    return None
                trying, longest = "again", EXPLORE_DRAFTS
        drafts = self._drafts(batch, [min(n, longest) for n in wanted])
        if adaptive and trying is None:
            drafts = fair(drafts, acceptances, costs)  # lookups may find fewer than wanted
        if not any(drafts):
            return None
        if trying == "first":
            self._since_try = 0
            if costs.has_run(len(batch.uids), max(map(len, drafts))):
                # Only a busy batch kept it from teaching (a shape's first run never does).
                gap = self._try_gaps.get(size, FIRST_PAUSE)
                self._try_gaps[size] = min(2 * gap, LONGEST_PAUSE)
        elif trying == "again":
            self._since_retry = 0
            self._retry_gap = min(2 * self._retry_gap, LONGEST_PAUSE)
        elif adaptive:
            self._retry_gap = RETRY_GAP
        return drafts

    def _drafts(self, batch: Any, most: list[int]) -> list[list[int]]:
        """Each row's drafts, at most `most[i]` for row i (batch order)."""
        if self._model_drafter is not None:
            asks = {
                uid: DraftAsk(batch.tokens[i], self._known.get(uid), most[i])
                for i, uid in enumerate(batch.uids)
                if uid in self._rows
            }
            drafted = self._model_drafter.draft(asks)
            return [drafted.get(uid, []) for uid in batch.uids]
        drafts: list[list[int]] = []
        for i, uid in enumerate(batch.uids):
            drafter = self._rows.get(uid)
            if drafter is None or most[i] <= 0:
                drafts.append([])
                continue
            drafts.append(drafter.drafts(batch.tokens[i], most[i], self._known.get(uid)))
        return drafts

    def _timed(
        self,
        kind: Literal["plain", "verify"],
        rows: int,
        drafts: int,
        quiet: bool,
        spent: float = 0.0,
    ) -> None:
        """A step was read: teach the costs of `rows` rows its time where it is its own
        (`spent`: time in the interval that was not the step's, as drafts not used)."""
        now = time.perf_counter()
        costs = self.costs.at(rows)
        # A read waits for the forward launched a call earlier, behind that call's chunk if
        # any: two quiet calls in a row make the interval the steps' own.
        quiet, self._was_quiet = quiet and self._was_quiet, quiet
        seconds: float | None = None
        if self._last_read is not None and quiet and rows == self._last_rows:
            seconds = now - self._last_read - spent
        if kind == "plain":
            if seconds is not None and self._last_kind == "plain":
                costs.plain(seconds)  # after a verify the read waited for nothing
        else:
            # The whole interval is the verify's: the plain step before it, still computing
            # at the last read, gives its token in this interval too (each row's first
            # emitted token), which the control counts as the verify's "1" of 1 + a + ...
            costs.observed(rows, drafts, seconds)  # untimed, it still ran its shape
        self._last_read, self._last_kind, self._last_rows = now, kind, rows

    def _verify(self, batch: Any, drafts: list[list[int]], quiet: bool) -> list[Any]:
        """Run one verify step of `batch` (module docstring); its responses, as `next`'s."""
        uids = list(batch.uids)
        rows = len(uids)
        longest = max(len(d) for d in drafts)
        positions = longest + 1
        current = batch._next_tokens
        before = batch._next_logprobs
        batch._current_tokens, batch._current_logprobs = current, before
        padded = [d + [0] * (longest - len(d)) for d in drafts]
        inputs = mx.concatenate(
            [current.astype(mx.uint32)[:, None], mx.array(padded, dtype=mx.uint32)], axis=1
        )
        logits = self._model(inputs, cache=batch.prompt_cache)
        first = logits[:, 0, :]
        context: list[mx.array] = []
        if any(batch.logits_processors):  # as `_step` applies them, on the first position
            first, context = apply_processors(
                first, current, batch.logits_processors, batch._token_context
            )
        first_logprobs = first - mx.logsumexp(first, axis=-1, keepdims=True)
        drafting = [i for i in range(rows) if drafts[i]]
        plain = [i for i in range(rows) if not drafts[i]]
        chosen = logits[mx.array(drafting)]
        logprobs = chosen - mx.logsumexp(chosen, axis=-1, keepdims=True)
        keyed: list[Any] = []
        biases: list[Any] = []
        draws: list[int] = []
        for i in drafting:
            sampler, bias, next_draw = self._rows[uids[i]].draws.parts()
            keyed += [sampler] * positions
            biases += [bias] * positions
            draws += range(next_draw, next_draw + positions)
        flat = logprobs.reshape(len(drafting) * positions, -1)
        drawn = sample_rows(keyed, flat, biases, draws=draws).reshape(len(drafting), positions)
        plain_drawn = (
            sample_batch([self._samplers[uids[i]] for i in plain], first_logprobs[mx.array(plain)])
            if plain
            else mx.array([], dtype=mx.uint32)
        )
        mx.async_eval(drawn, plain_drawn, logprobs, first_logprobs, context)  # type: ignore[no-untyped-call]
        mx.eval(current, before)
        inputs_read: list[int] = current.tolist()
        drawn_read: list[list[int]] = drawn.tolist()  # type: ignore[assignment]
        plain_read: list[int] = plain_drawn.tolist()  # type: ignore[assignment]
        self._timed("verify", rows, longest, quiet)
        return self._settle(batch, uids, drafts, inputs_read, drawn_read, plain_read, logprobs,
                            first_logprobs, positions)  # fmt: skip

    def _settle(
        self,
        batch: Any,
        uids: list[int],
        drafts: list[list[int]],
        inputs: list[int],
        drawn: list[list[int]],
        plain_drawn: list[int],
        logprobs: mx.array,
        first_logprobs: mx.array,
        positions: int,
    ) -> list[Any]:
        """Keep each row's accepted tokens (cut by its stop tokens and `max_tokens`), realign
        the KV, and answer as `next` does: a response per kept token, finished rows' KV
        extracted and the rows filtered out."""
        before = batch._current_logprobs
        kept: list[int] = []
        finished: list[str | None] = []
        next_tokens: list[int] = []
        next_logprobs: list[mx.array] = []
        emitted: list[list[tuple[int, mx.array]]] = []
        spec_row = plain_row = 0
        for i, uid in enumerate(uids):
            row_drafts = drafts[i]
            accepted = 0
            if row_drafts:
                row_drawn = drawn[spec_row]
                while accepted < len(row_drafts) and row_drafts[accepted] == row_drawn[accepted]:
                    accepted += 1
            tokens = [(inputs[i], before[i])]
            tokens += [(row_drafts[j], logprobs[spec_row, j]) for j in range(accepted)]
            reason = None
            count = 0
            for token, _ in tokens:
                count += 1
                batch._num_tokens[i] += 1
                if batch._num_tokens[i] >= batch.max_tokens[i]:
                    reason = "length"
                if batch._matchers[i].advance(token):
                    reason = "stop"
                if reason is not None:
                    break
            emitted.append(tokens[:count])
            kept.append(count)
            finished.append(reason)
            if row_drafts:
                next_tokens.append(row_drawn[count - 1])
                next_logprobs.append(logprobs[spec_row, count - 1])
                drafter = self._rows[uid]
                drafter.control.verified(len(row_drafts), accepted)
                drafter.draws.advance(count)
                drafter.verified(len(row_drafts), count - 1)
                spec_row += 1
            else:
                next_tokens.append(plain_drawn[plain_row])
                next_logprobs.append(first_logprobs[i])
                plain_row += 1
        realign(batch.prompt_cache, positions, kept)
        responses: list[Any] = []
        keep: list[int] = []
        self._known = {}
        for i, uid in enumerate(uids):
            batch.tokens[i].extend(token for token, _ in emitted[i])
            reason = finished[i]
            for token, token_logprobs in emitted[i][:-1]:
                responses.append(batch.Response(uid, token, token_logprobs, None, None, None))
            token, token_logprobs = emitted[i][-1]
            if reason is None:
                keep.append(i)
                self._known[uid] = next_tokens[i]
                responses.append(batch.Response(uid, token, token_logprobs, None, None, None))
            else:
                cache = batch.extract_cache(i)
                responses.append(
                    batch.Response(uid, token, token_logprobs, reason, cache, batch.tokens[i])
                )
        batch._next_tokens = mx.array(next_tokens, dtype=mx.uint32)
        batch._next_logprobs = next_logprobs
        if len(keep) < len(uids):
            batch.filter(keep)
        return responses


def realign(cache: list[Any], positions: int, kept: list[int]) -> None:
    """After a verify of `positions` positions per row, where row i keeps its first
    `kept[i]`: trim the shared write index to the most kept, and roll each row that kept
    fewer right by the difference (its left padding grows by as much), so that every row's
    tokens end at the index again (module docstring)."""
    most = max(kept)
    if positions > most:
        for layer in cache:
            layer.trim(positions - most)
    shift_rows(cache, [most - k for k in kept])
