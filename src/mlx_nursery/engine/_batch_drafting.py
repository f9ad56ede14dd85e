"""What the running batch drafts for its next step: each row's drafter and control, the
step's costs by batch size, and the rule that keeps a row from paying for another's drafts.

Inside the batch (`_batch_speculating.py`) every row that may draft (no logits processors,
one of our samplers: the same conditions as on the fast path, `_speculating.Speculator`)
has a `RowDrafter`: its drafts (prompt lookup, or the draft model), its `DraftControl`
(its acceptance, its pauses), and its position draws. A verify step is one forward for the
whole batch, padded to its longest draft, so its cost falls on every row, those without
drafts included. `fair` therefore picks the step's draft length by the measured costs of
the batch's size (`BatchCosts`) and every row's acceptance: the length with the most
expected tokens per second over the batch, among those where no row's expected rate falls
more than `FAIR_SLOWDOWN` below plain decoding's; none where none is. On a backend whose
forward costs grow with its positions (this CPU), that is no drafts. Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ._draft_model import ModelDrafter
from ._drafting import DraftControl, NgramIndex, Speculation, VerifyCosts
from ._sampling import PositionDraws, position_draws
from ._sequence import LiveSequence
from ._speculating import draft_source, verify_counter

FAIR_SLOWDOWN = 0.05
"""The most a verify step may lower any row's expected tokens per second, by the measured
costs, against decoding without drafts (issue 34: speculation must not cost a request more)."""


class BatchCosts:
    """`VerifyCosts` per batch size (rounded up to a power of two: a verify's cost depends
    on how many rows it runs), measured on the batch; `select` sets the size the controls'
    questions are about."""

    def __init__(self) -> None:
        self._by_size: dict[int, VerifyCosts] = {}
        self.current = self.at(1)

    @staticmethod
    def size(rows: int) -> int:
        """The size whose costs a batch of `rows` rows shares."""
        return 1 << max(0, rows - 1).bit_length()

    def at(self, rows: int) -> VerifyCosts:
        size = self.size(rows)
        costs = self._by_size.get(size)
        if costs is None:
            costs = self._by_size[size] = VerifyCosts()
        return costs

    def select(self, rows: int) -> VerifyCosts:
        self.current = self.at(rows)
        return self.current

    @property
    def plain_s(self) -> float | None:
        return self.current.plain_s

    def step_seconds(self, drafts: int) -> float | None:
        return self.current.step_seconds(drafts)

    def promising(self, most: int) -> bool:
        return self.current.promising(most)


@attrs.define
class RowDrafter:
    """One batch row's drafting state. Its index catches up with the row's context (the
    tokens in its KV, mlx-lm's `GenerationBatch.tokens`) only when it drafts: plain steps
    cost it nothing."""

    index: NgramIndex | ModelDrafter | None
    """None: the batch's draft model drafts for it with the other rows
    (`_batch_model_drafting.BatchModelDrafter`)."""
    control: DraftControl
    draws: PositionDraws
    verified: Callable[[int, int], None]
    """Told each verify's drafted tokens and the drafts kept (the sequence's usage, the
    engine's counters)."""

    def drafts(self, context: Sequence[int], most: int, known: int | None) -> list[int]:
        """At most `most` drafts to follow `context` and its next input: `known`, or, while
        it computes (None), the guess the lookup makes at it, dropped."""
        index = self.index
        assert index is not None, "the batch's draft model drafts for this row"
        if len(index) < len(context):
            index.extend(context[len(index) :])
        if known is None:
            return index.draft(most + 1)[1:]
        if len(index) == len(context):
            index.extend((known,))
        return index.draft(most)


def row_drafter(
    spec: Speculation,
    sequence: LiveSequence,
    costs: BatchCosts,
    report: Callable[[LiveSequence, int, int], None] | None,
    draft_model: Any = None,
    *,
    batched: bool = False,
) -> RowDrafter | None:
    """A drafter for `sequence`'s row, or None where it decodes without drafts (logits
    processors, a sampler not ours: `_speculating.py`'s docstring says why); `batched`: the
    batch's draft model drafts for it (no source of its own)."""
    if sequence.processors:
        return None
    draws = position_draws(sequence.sampler)
    if draws is None:
        return None

    control = DraftControl(spec.tokens, costs, adaptive=spec.adaptive)
    source = None if batched else draft_source(spec, draft_model, [])
    return RowDrafter(source, control, draws, verify_counter(sequence, report))


def expected_tokens(acceptance: float, drafts: int) -> float:
    """Tokens a step with `drafts` drafts gives, each accepted with `acceptance`."""
    return sum(acceptance**j for j in range(drafts + 1))


def fair(
    drafts: list[list[int]], acceptances: list[float | None], costs: VerifyCosts
) -> list[list[int]]:
    """`drafts` (a row's, in batch order) cut to the step's length (module docstring);
    `acceptances[i]` is row i's (None: it has no drafter). Unchanged while a cost is
    unknown: the step is a try that measures it."""
    plain = costs.step_seconds(0)
    if plain is None or costs.step_seconds(1) is None:
        return drafts
    floor = (1.0 - FAIR_SLOWDOWN) / plain
    best, best_rate = 0, len(drafts) / plain
    for k in range(1, max(len(d) for d in drafts) + 1):
        seconds = costs.step_seconds(k)
        assert seconds is not None
        total = 0.0
        for row, acceptance in zip(drafts, acceptances, strict=True):
            tokens = expected_tokens(acceptance or 0.0, min(len(row), k))
            if tokens / seconds < floor:
                break
            total += tokens
        else:
            if total / seconds > best_rate:
                best, best_rate = k, total / seconds
    return [row[:best] for row in drafts]
