"""The engine thread's bookkeeping rules, as pure logic: the ledger's checks and the
verdict after a failed step. (The whole engine suite runs with the checks on.)"""

from __future__ import annotations

from typing import Any

import pytest

from mlx_nursery.engine import EngineConfig, GenerationRequest
from mlx_nursery.engine._ledger import InvariantViolation, Ledger, SeqState
from mlx_nursery.engine._messages import Delivery, StepEvent, Submit
from mlx_nursery.engine._outbox import Outbox
from mlx_nursery.engine._recovery import STRIKES_TO_BLAME, judge
from mlx_nursery.engine._sequence import LiveSequence


class Holding:
    """A stepper that holds the uids it is told (only `uids` and `drafting`, the rows with
    speculation's state, are consulted by the check)."""

    def __init__(self, *uids: int, drafting: frozenset[int] = frozenset()) -> None:
        self.uids = frozenset(uids)
        self.drafting = drafting


def sequence(seq_id: int, *, newcomer: bool = False) -> LiveSequence:
    live = LiveSequence(seq_id, GenerationRequest([1, 2, 3], 4), None, [], frozenset(), failures=[])
    live.newcomer = newcomer
    return live


def ledger() -> tuple[Ledger, list[Delivery]]:
    posted: list[Delivery] = []
    outbox = Outbox(posted.append, lambda: None)  # type: ignore[arg-type, return-value]
    return Ledger(outbox, checking=True), posted


def test_the_suite_runs_with_the_checks_on(tmp_path: Any) -> None:
    assert EngineConfig(tmp_path).check_invariants


def test_a_settled_ledger_passes() -> None:
    book, posted = ledger()
    book.activate(sequence(0), 7)
    book.to_probation(sequence(1))
    book.hold([Submit(2, GenerationRequest([1], 1))])
    book.check(Holding(7), Holding())
    assert book.running == 3 and posted == []
    assert [book.state_of(i) for i in range(3)] == [
        SeqState.ACTIVE,
        SeqState.PROBATION,
        SeqState.HELD,
    ]


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda book: book.activate(sequence(1), 8), "does not hold exactly"),
        (lambda book: book._by_uid.update({9: sequence(5)}), "maps to no active sequence"),
        (lambda book: book._sequences[SeqState.PROBATION].update({0: sequence(0)}), "two places"),
        (lambda book: book._state.update({0: SeqState.PREEMPTED}), "its state does not say"),
        (lambda book: book.remove(book.sequence(0), Holding(), "stop"), "not posted, detached"),
        (lambda book: book.finish(sequence(3), StepEvent(None), ([], [1])), "not posted, detached"),
        (lambda book: book.end(4, StepEvent(None, finish_reason="stop")), "not posted, detached"),
    ],
)
def test_each_broken_rule_is_caught(break_it: Any, message: str) -> None:
    book, _ = ledger()
    book.activate(sequence(0), 7)
    break_it(book)
    with pytest.raises(InvariantViolation, match=message):
        book.check(Holding(7), Holding())


def test_a_stepper_not_in_use_must_hold_nothing() -> None:
    book, _ = ledger()
    with pytest.raises(InvariantViolation, match="not in use"):
        book.check(Holding(), Holding(3))
    with pytest.raises(InvariantViolation, match="not in use"):
        book.check(Holding(), Holding(drafting=frozenset({3})))


def test_batch_rows_draft_only_for_sequences_the_batch_holds() -> None:
    book, _ = ledger()
    book.activate(sequence(0), 7)
    book.check(Holding(7, drafting=frozenset({7})), Holding())
    with pytest.raises(InvariantViolation, match="drafts for a sequence"):
        book.check(Holding(7, drafting=frozenset({7, 8})), Holding())


def test_a_sequence_ends_once_and_never_comes_back() -> None:
    book, posted = ledger()
    live = sequence(0)
    book.activate(live, 7)
    book.remove(live, Holding(7), "cancelled")  # type: ignore[arg-type]
    assert book.detaching() and not book.stepping()
    assert book.state_of(0) is SeqState.DETACHING
    book._outbox.post()
    book.detached(live, None)
    assert book.state_of(0) is None
    assert [d.finished for d in posted] == [[0]]
    assert posted[0].events[0][1].finish_reason == "cancelled"
    with pytest.raises(InvariantViolation, match="ended twice"):
        book.end(0, StepEvent(None, finish_reason="stop"))
    book.activate(live, 7)
    with pytest.raises(InvariantViolation, match="back after its end"):
        book.check(Holding(7), Holding())


def test_the_verdict_blames_a_lone_suspect_only_on_its_second_failure() -> None:
    old, new = sequence(0), sequence(1, newcomer=True)
    first = judge([old, new], solo=False)
    assert first.blamed is None and first.replay_now == [old] and first.probation == [new]
    assert not first.unexplained
    for _ in range(STRIKES_TO_BLAME - 2):
        judge([new], solo=False)
    second = judge([new], solo=False)
    assert second.blamed is new and second.probation == [] and second.replay_now == []


def test_the_verdict_without_suspects_holds_everyone_and_counts_against_the_engine() -> None:
    batch = [sequence(0), sequence(1)]
    verdict = judge(batch, solo=False)
    assert verdict.unexplained and verdict.probation == batch and verdict.blamed is None


def test_the_fast_path_sequence_is_always_the_suspect() -> None:
    lone = sequence(0)
    verdict = judge([lone], solo=True)
    assert verdict.probation == [lone] and lone.strikes == 1


def test_several_suspects_wait_on_probation_without_strikes() -> None:
    a, b, c = sequence(0, newcomer=True), sequence(1, newcomer=True), sequence(2)
    verdict = judge([a, b, c], solo=False)
    assert verdict.probation == [a, b] and verdict.replay_now == [c]
    assert a.strikes == b.strikes == 0
