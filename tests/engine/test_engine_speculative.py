"""Speculative decoding by prompt lookup on the fast path: the tokens of plain decoding.

Each request runs on an engine without speculation and on one that drafts a fixed number of
tokens whenever its context offers some (`adaptive=False`, so that verify steps run however
their cost compares on this machine); the tokens, usage and logprobs must agree.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import trio

from mlx_nursery.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    Speculation,
    open_engine,
)
from mlx_nursery.engine._draft_model import DraftModelMismatch
from mlx_nursery.engine._drafting import (
    FIRST_PAUSE,
    GUESS_MARGIN,
    LONGEST_PAUSE,
    DraftControl,
    NgramIndex,
    VerifyCosts,
)
from mlx_nursery.engine._sampling import PositionDraws
from mlx_nursery.engine._speculating import Outcome, Speculator, Verify
from tests.helpers import Run, collect

# The tiny model repeats itself on this prompt: drafts are found and most are accepted.
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 3
SPECULATING = Speculation(tokens=4, adaptive=False)
GREEDY = SamplingParams(temperature=0.0)


def _config(tiny_model: Path, **changes: object) -> EngineConfig:
    config = EngineConfig(tiny_model, max_concurrency=4, prefill_step_size=64, warmup=False)
    return attrs.evolve(config, **changes)


def _drafts(engine: Engine) -> tuple[int, int, int]:
    worker = engine.statistics().worker
    assert worker is not None
    return worker.verify_steps, worker.draft_tokens, worker.accepted_draft_tokens


async def _both(
    tiny_model: Path, requests: list[GenerationRequest], **changes: object
) -> tuple[list[Run], list[Run], tuple[int, int, int]]:
    async with open_engine(_config(tiny_model, **changes)) as plain:
        reference = [await collect(plain, r) for r in requests]
        assert _drafts(plain) == (0, 0, 0)
    async with open_engine(_config(tiny_model, speculation=SPECULATING, **changes)) as fast:
        runs = [await collect(fast, r) for r in requests]
        stats = fast.statistics()
        assert stats.lanes_borrowed == 0 and stats.late_events == 0
        return reference, runs, _drafts(fast)


def _tokenized(text: str, tiny_model: Path) -> tuple[int, ...]:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return tuple(load_tokenizer(tiny_model).encode(text))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_p=0.9, seed=11),
        SamplingParams(temperature=0.2, seed=11),
    ],
    ids=["greedy", "seeded", "seeded-cool"],
)
async def test_speculation_gives_plain_decodings_tokens(
    tiny_model: Path, sampling: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Which verifies ran behind another (launched before it was read) and whether they held.
    behind: list[bool] = []
    resolve = Speculator.resolve

    def watched(self: Speculator, verify: Verify, *args: Any) -> Outcome:
        outcome = resolve(self, verify, *args)
        if len(args) == 4 and args[3] is not None:
            behind.append(outcome.continued)
        return outcome

    monkeypatch.setattr(Speculator, "resolve", watched)
    prompt = _tokenized(PROMPT, tiny_model)
    asked = GenerationRequest(prompt, 120, sampling, ignore_eos=True, logprobs=2)
    (reference,), (run,), (steps, drafted, accepted) = await _both(tiny_model, [asked])
    assert run.tokens == reference.tokens and len(run.tokens) == 120
    assert steps > 0 and drafted > 0
    if sampling.temperature == 0.0:  # the tiny model loops: verifies behind verifies held
        assert True in behind
    if sampling.temperature == 0.2:  # mostly held, one dropped (this seed): both paths ran
        assert True in behind and False in behind
    usage = run.final.usage
    assert usage is not None and usage.completion_tokens == 120
    assert (usage.draft_tokens, usage.accepted_draft_tokens) == (drafted, accepted)
    if sampling.temperature == 0.0:
        assert accepted > 0  # several tokens per step, not only drafts tried
    for ours, theirs in zip(run.events, reference.events, strict=True):
        assert ours.logprob is not None and theirs.logprob is not None
        assert ours.logprob.logprob == pytest.approx(theirs.logprob.logprob, abs=1e-4)
        assert [t for t, _ in ours.logprob.top] == [t for t, _ in theirs.logprob.top]


async def test_the_accepted_run_is_cut_at_a_stop_token_and_at_max_tokens(
    tiny_model: Path,
) -> None:
    # The tiny model answers this with one token repeated, then another: drafts of the first
    # are accepted until the second, which ends the run as a stop token.
    greedy = GenerationRequest(_tokenized("Hello world", tiny_model), 40, GREEDY, ignore_eos=True)
    async with open_engine(_config(tiny_model)) as plain:
        free = await collect(plain, greedy)
    stop = free.tokens[-1]
    assert free.tokens.index(stop) >= 5
    cut = [
        attrs.evolve(greedy, stop_token_ids=frozenset({stop})),
        attrs.evolve(greedy, max_tokens=7),
        attrs.evolve(greedy, max_tokens=1),
    ]
    reference, runs, (_, drafted, _) = await _both(tiny_model, cut)
    assert drafted > 0
    for ours, theirs in zip(runs, reference, strict=True):
        assert ours.tokens == theirs.tokens
        assert ours.final.finish_reason == theirs.final.finish_reason
        assert ours.final.usage is not None and theirs.final.usage is not None
        assert ours.final.usage.completion_tokens == theirs.final.usage.completion_tokens
    assert runs[0].final.finish_reason == "stop" and len(runs[1].tokens) == 7


async def test_rows_with_logits_processors_decode_without_drafts(tiny_model: Path) -> None:
    prompt = _tokenized(PROMPT, tiny_model)
    penalized = SamplingParams(temperature=0.0, repetition_penalty=1.2)
    (reference,), (run,), drafts = await _both(
        tiny_model, [GenerationRequest(prompt, 12, penalized, ignore_eos=True)]
    )
    assert run.tokens == reference.tokens and drafts == (0, 0, 0)


async def test_handover_and_cancel_while_speculating(tiny_model: Path) -> None:
    """Company arriving mid-stream moves the lone sequence into the batch with its KV as
    plain decoding leaves it; a cancel stops it within a step. The invariant checker runs."""
    prompt = _tokenized(PROMPT, tiny_model)
    first = GenerationRequest(prompt, 40, GREEDY, ignore_eos=True)
    second = GenerationRequest(prompt[:20], 10, GREEDY, ignore_eos=True)
    async with open_engine(_config(tiny_model, single_sequence_fast_path=False)) as batch:
        reference = await collect(batch, first)
        reference_second = await collect(batch, second)
    config = _config(tiny_model, speculation=SPECULATING, prompt_cache_bytes=0)
    async with open_engine(config) as engine:
        runs: dict[str, Run] = {}
        company = trio.Event()

        async def run_second() -> None:
            await company.wait()
            runs["second"] = await collect(engine, second)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_second)
            async with engine.generate(first) as stream:
                events = []
                async for event in stream:
                    events.append(event)
                    if len(events) == 12:  # verify steps have run (asserted below)
                        company.set()
        verifies_before_company, _, _ = _drafts(engine)
        assert verifies_before_company > 0
        assert [e.token_id for e in events if e.token_id is not None] == reference.tokens
        assert runs["second"].tokens == reference_second.tokens
        worker = engine.statistics().worker
        assert worker is not None and worker.handovers == 1

        with trio.CancelScope() as scope:
            async with engine.generate(attrs.evolve(first, max_tokens=400)) as stream:
                count = 0
                async for _ in stream:
                    count += 1
                    if count == 10:
                        scope.cancel()
        assert stream.steps_in_flight_at_cancel is not None
        assert stream.steps_in_flight_at_cancel <= 1
        stats = engine.statistics()
        assert stats.lanes_borrowed == 0 and stats.late_events == 0
        assert stats.worker is not None and stats.worker.generated_tokens < 40 + 10 + 60


def test_ngram_lookup_takes_the_longest_suffix_and_its_latest_occurrence() -> None:
    index = NgramIndex(Speculation(ngram_max=3, ngram_min=1), [1, 2, 3, 9, 2, 3, 7, 1, 2, 3])
    assert index.draft(2) == [9, 2]  # (1, 2, 3) occurred at the start, before 9
    index = NgramIndex(Speculation(ngram_max=3, ngram_min=1), [5, 2, 3, 9, 2, 3, 7, 8, 3])
    assert index.draft(3) == [7, 8, 3]  # no (7, 8, 3) or (8, 3) before: (3,) latest, at 5
    index.extend([4])
    assert index.draft(3) == []  # 4 never occurred before
    index = NgramIndex(Speculation(ngram_max=2, ngram_min=1), [6, 7, 6, 7])
    assert index.draft(5) == [6, 7, 6, 7, 6]  # the copy reaching the end goes on from its start
    index = NgramIndex(Speculation(ngram_max=2, ngram_min=2), [1, 2, 1, 3, 1])
    assert index.draft(4) == []  # (3, 1) never occurred before; a lone 1 is too short


def test_ngram_lookup_past_drafts_in_flight_leaves_the_context_as_it_was() -> None:
    spec = Speculation(ngram_max=3, ngram_min=1)
    context = [1, 2, 3, 4, 5, 6, 9, 1, 2]
    index = NgramIndex(spec, context)
    assert index.draft(3, assumed=[3, 4]) == [5, 6, 9]  # as if the context held 3, 4
    assert index.draft(3) == [3, 4, 5]  # unchanged by the lookup past it
    assert index.draft(4, assumed=[8]) == []  # (1, 2, 8), (2, 8), (8,): never before
    index = NgramIndex(spec, [6, 7])
    assert index.draft(5, assumed=[6]) == [7, 6, 7, 6, 7]  # an overlapping copy
    for context, assumed in (([1, 2, 3, 1, 2], [4, 1, 2]), ([6, 7], [6, 7]), ([5, 5], [6])):
        extended = NgramIndex(spec, [*context, *assumed])
        for most in (1, 3, 5):  # n-grams ending in `assumed` count as in the context
            assert NgramIndex(spec, context).draft(most, assumed) == extended.draft(most)


def test_a_verifys_fixed_part_is_not_charged_to_each_draft() -> None:
    """A verify costs a fixed part (it is read before the next step is built; a draft model
    runs first) and a part per draft: each length's cost is kept, others interpolated, and a
    length measured alone is a guess for the others that the control then tries."""
    costs = VerifyCosts()
    costs.plain(0.010)
    costs.verify(1, 0.015)  # one draft: half a step more, nearly all of it the fixed part
    assert costs.step_seconds(4) == pytest.approx(0.015 * (1 + 3 * GUESS_MARGIN))
    control = DraftControl(4, costs)
    for _ in range(10):
        control.verified(1, 1)
    assert control.drafts() == 4  # charged 5 ms a draft, 4 drafts would look a loss
    cheap = VerifyCosts()  # a verify about a plain step's cost (a host-bound small model)
    cheap.plain(0.010)
    cheap.verify(1, 0.0101)
    rare = DraftControl(8, cheap)
    for _ in range(12):
        rare.verified(1, 0)
    rare.verified(4, 1)
    assert 0.05 < rare.acceptance < 0.1
    assert rare.best() == 1  # 8 guessed at 1's cost would win by the tokens rarely kept
    costs.verify(4, 0.018)
    assert costs.step_seconds(2) == pytest.approx(0.016)
    assert costs.step_seconds(8) == pytest.approx(0.022)  # the slope of the longest two


def test_one_odd_sample_moves_no_cost_and_no_verify_looks_cheaper_than_a_plain_step() -> None:
    """On an H200 one sample far below a plain step's cost (a verify launched ahead of a
    plain step's read: its share of the interval is a difference) was taken as the truth
    and made every length look cheaper than a plain step, so a chat that kept a sixth of
    its drafts drafted nearly every step, and lost. Each cost is the median of its latest
    samples, and no verify is cheaper than a plain step."""
    costs = VerifyCosts()
    for _ in range(5):
        costs.plain(0.0085)
        for k in range(1, 5):
            costs.verify(k, 0.0100 + 0.0005 * k)
    control = DraftControl(4, costs)
    for _ in range(30):
        control.verified(6, 1)  # a sixth of the drafts kept
    assert control.best() == 0  # a verify's 18-27% more time buys fewer tokens than that
    costs.verify(3, 0.0006)  # the odd sample, and a stall
    costs.verify(2, 0.4)
    assert costs.step_seconds(3) == pytest.approx(0.0115)
    assert costs.step_seconds(2) == pytest.approx(0.0110)
    assert control.best() == 0
    alone = VerifyCosts()
    alone.plain(0.0085)
    alone.verify(3, 0.0006)
    assert alone.step_seconds(1) == alone.step_seconds(3) == pytest.approx(0.0085)


def test_the_step_built_after_a_verifys_read_is_charged_to_the_verify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain step overlaps its building with the step before; the one launched after a
    verify's read cannot, so its time beyond a plain step's is the verify's, not a plain
    step's (counted as plain, it made verifies look cheap where they cost)."""
    import mlx.core as mx

    from mlx_nursery.engine import _speculating
    from mlx_nursery.engine._sampling import PositionDraws

    clock = [100.0]
    monkeypatch.setattr(_speculating, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    costs = VerifyCosts()
    costs.plain(0.010)
    costs.observed(1, 1, None)  # the shape's first run, which teaches nothing
    speculator = Speculator(
        Speculation(), None, [1, 2, 3], PositionDraws(None, None), costs, lambda d, a: None
    )
    speculator.last_read = 100.0
    rejected = Verify(5, [7], mx.array([9, 9]), mx.zeros((2, 4)), started=100.0, ahead=False)
    clock[0] = 100.012
    outcome = speculator.resolve(rejected, [], 10, frozenset())
    assert outcome.tokens == [9] and not outcome.continued
    clock[0] = 100.030  # the step after: 18 ms, built only once the verify was read
    speculator.plain_read(timed=True)
    assert costs.plain_s == pytest.approx(0.010)
    assert costs.step_seconds(1) == pytest.approx(0.012 + 0.008)
    # Untimed: a verify was launched before that read, and its own interval, from the
    # verify's read on, holds the step's extra time: the rejected verify keeps its own.
    costs.observed(1, 2, None)
    rejected = Verify(5, [7, 7], mx.array([9, 9, 9]), mx.zeros((3, 4)), 100.030, False)
    clock[0] = 100.044
    speculator.resolve(rejected, [], 10, frozenset())
    clock[0] = 100.062
    speculator.plain_read(timed=False)
    assert costs.step_seconds(2) == pytest.approx(0.014)
    # A rejected verify that ends its sequence (max_tokens reached): no step follows it,
    # so it is charged as read, not left waiting for a read that never comes.
    ending = Verify(5, [7, 7], mx.array([9, 9, 9]), mx.zeros((3, 4)), 100.062, False)
    clock[0] = 100.075
    assert speculator.resolve(ending, [], 1, frozenset()).tokens == [9]
    assert costs.step_seconds(2) == pytest.approx(0.013)  # the lower of its two samples


def test_draft_control_drafts_what_pays_and_backs_off_where_nothing_does() -> None:
    costs = VerifyCosts()
    control = DraftControl(8, costs)
    assert control.drafts() == 0  # no plain step's cost yet: nothing to judge a verify by
    costs.plain(0.010)
    assert control.drafts() == 1  # a verify's cost unknown: a short try, to measure it
    costs.verify(4, 0.012)  # cheap drafts (a GPU): a fixed part, then 0.5 ms each
    costs.verify(1, 0.0105)
    for _ in range(20):
        control.verified(4, 4)
    assert control.drafts() == 8
    for _ in range(20):
        control.verified(4, 1)
    assert 1 <= control.drafts() < 8  # a quarter accepted: short drafts still pay
    for _ in range(20):
        control.verified(4, 0)
    assert control.drafts() == 0  # nothing accepted: not even cheap drafts pay

    linear = VerifyCosts()  # each draft costs a whole step (this CPU): only certainty pays
    linear.plain(0.010)
    linear.verify(4, 0.050)
    linear.verify(1, 0.020)
    assert not linear.promising(8)
    control = DraftControl(8, linear)
    control.verified(4, 0)
    assert control.drafts() == 0  # starts a pause: the longest, as nothing could pay much
    assert [control.drafts() for _ in range(LONGEST_PAUSE + 1)] == [0] * LONGEST_PAUSE + [1]

    sublinear = VerifyCosts()  # drafts cost a fifth of a step: worth retrying soon
    sublinear.plain(0.010)
    sublinear.verify(4, 0.018)
    sublinear.verify(1, 0.012)
    control = DraftControl(8, sublinear)
    for _ in range(20):
        control.verified(4, 0)
    pauses = []
    for _ in range(3):
        assert control.drafts() == 0  # starts a pause
        plain = 1
        while control.drafts() == 0:
            plain += 1
        pauses.append(plain)
        control.verified(1, 0)  # the try after the pause did not pay either
    assert pauses == [FIRST_PAUSE + 1, 2 * FIRST_PAUSE + 1, 4 * FIRST_PAUSE + 1]
    # A try whose lookup finds nothing is not made: it stays asked for until a step drafts,
    # and the pause doubles only after that.
    assert control.drafts() == 0
    assert [control.drafts() for _ in range(8 * FIRST_PAUSE + 2)][-3:] == [0, 1, 1]
    control.verified(1, 0)
    assert control.drafts() == 0
    plain = 1
    while control.drafts() == 0:
        plain += 1
    assert plain == 16 * FIRST_PAUSE + 1


def test_an_adaptive_sequence_decodes_plainly_until_a_plain_steps_cost_is_known() -> None:
    """A verify's cost is judged against a plain step's. A source that always has drafts (a
    draft model) drafted on every step while that cost was unknown, so it never became
    known, and a draft model whose drafts were never accepted verified every step
    (0.47x of off on an H200)."""
    costs = VerifyCosts()
    adaptive = Speculator(
        Speculation(tokens=4), None, [1, 2, 3], PositionDraws(None, None), costs, lambda d, a: None
    )
    fixed = Speculator(
        Speculation(tokens=4, adaptive=False),
        None,
        [1, 2, 3],
        PositionDraws(None, None),
        costs,
        lambda d, a: None,
    )
    assert adaptive.plan() == 0 and adaptive.plan() == 0
    assert fixed.plan() == 4  # fixed drafts draft whatever is known
    costs.plain(0.010)
    assert adaptive.plan() == 1  # a verify's cost unknown: a short try, to measure


async def test_the_second_tokens_step_teaches_no_plain_cost(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second token's step is built only after the first token's read, so its interval
    holds that building and the host's work on the read: several plain steps' time. Taught
    as the first plain cost, it made verifies look cheap (no verify counts as cheaper than
    a plain step), a sequence that always found drafts never paused to measure again, and
    a lone request ran at half of plain decoding's rate."""
    from mlx_nursery.engine import _speculating

    clock = [0.0]
    taught: list[float] = []
    plain = VerifyCosts.plain

    def ticking() -> float:
        clock[0] += 0.001  # every read a millisecond later: any interval would be taught
        return clock[0]

    def watched(costs: VerifyCosts, seconds: float) -> None:
        taught.append(seconds)
        plain(costs, seconds)

    monkeypatch.setattr(_speculating, "time", SimpleNamespace(perf_counter=ticking))
    monkeypatch.setattr(VerifyCosts, "plain", watched)
    reads: list[tuple[bool, int]] = []
    """Each plain read's `pipelined`, and the plain costs taught once it was read."""
    plain_read = Speculator.plain_read

    def read(self: Speculator, *, timed: bool, pipelined: bool = True) -> None:
        plain_read(self, timed=timed, pipelined=pipelined)
        reads.append((pipelined, len(taught)))

    monkeypatch.setattr(Speculator, "plain_read", read)
    spec = Speculation(tokens=4)
    prompt = _tokenized("Once upon a time, in a land far away,", tiny_model)
    async with open_engine(_config(tiny_model, speculation=spec)) as fast:
        await collect(fast, GenerationRequest(prompt, 6, GREEDY, ignore_eos=True))
    # The first token (its read starts the clock), the second (built after that read), then
    # pipelined plain steps: the first plain cost comes from the third token's read.
    assert reads[:3] == [(True, 0), (False, 0), (True, 1)]


def test_a_plain_step_built_after_the_last_read_teaches_no_plain_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlx_nursery.engine import _speculating

    clock = [100.0]
    monkeypatch.setattr(_speculating, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    costs = VerifyCosts()
    speculator = Speculator(
        Speculation(), None, [1, 2, 3], PositionDraws(None, None), costs, lambda d, a: None
    )
    speculator.plain_read(timed=True)  # the first token: nothing to time yet
    clock[0] = 100.040
    speculator.plain_read(timed=True, pipelined=False)  # built after that read
    assert costs.plain_s is None and speculator.plan() == 0
    clock[0] = 100.050
    speculator.plain_read(timed=True)
    assert costs.plain_s == pytest.approx(0.010)


async def test_an_adaptive_draft_model_that_is_never_right_stops_verifying_every_step(
    tiny_model: Path, other_weights: Path
) -> None:
    """Drafts always come from a draft model: the first steps are plain all the same, so the
    control learns what a plain step costs (with drafting on every step, it never did)."""
    spec = Speculation("draft", tokens=4, draft_model=str(other_weights))
    prompt = _tokenized("Once upon a time, in a land far away,", tiny_model)
    async with open_engine(_config(tiny_model, speculation=spec)) as fast:
        run = await collect(fast, GenerationRequest(prompt, 24, GREEDY, ignore_eos=True))
        steps, drafted, accepted = _drafts(fast)
    usage = run.final.usage
    assert usage is not None and usage.completion_tokens == 24
    # 23 steps after the prompt's: every one a verify before; now the first ones are plain.
    assert steps + accepted < 23
    # Then it tries, to measure a verify: the first of a shape teaches nothing (its kernels).
    assert steps >= 2 and drafted >= steps


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset with other random weights: the same tokenizer, other guesses."""
    from mlx_nursery.tools import make_model

    return make_model(tmp_path_factory.mktemp("draft") / "tiny-seed-7", "tiny", seed=7)


@pytest.mark.parametrize("draft", ["same", "other"])
async def test_a_draft_model_drafts_and_the_tokens_stay_plain_decodings(
    tiny_model: Path, other_weights: Path, draft: str
) -> None:
    """A draft model (`_draft_model.ModelDrafter`) in place of prompt lookup: the served
    model itself as its own draft (every greedy draft agrees), and a model with other
    weights (few do); the tokens are plain decoding's either way, greedy and seeded."""
    draft_model = str(tiny_model if draft == "same" else other_weights)
    spec = Speculation("draft", tokens=4, adaptive=False, draft_model=draft_model)
    prompt = _tokenized("Once upon a time, in a land far away,", tiny_model)
    requests = [
        GenerationRequest(prompt, 24, GREEDY, ignore_eos=True),
        GenerationRequest(prompt, 24, SamplingParams(temperature=0.8, seed=5), ignore_eos=True),
    ]
    async with open_engine(_config(tiny_model)) as plain:
        reference = [await collect(plain, r) for r in requests]
    async with open_engine(_config(tiny_model, speculation=spec)) as fast:
        runs = [await collect(fast, requests[0])]
        steps, drafted, accepted = _drafts(fast)  # the greedy request's
        runs.append(await collect(fast, requests[1]))
    assert [r.tokens for r in runs] == [r.tokens for r in reference]
    assert steps > 0 and drafted > 0
    if draft == "same":  # greedy drafts of the model itself: its own next tokens
        assert accepted >= drafted - 4  # all but those past max_tokens
    else:
        assert accepted < drafted
    usage = runs[0].final.usage
    assert usage is not None and usage.completion_tokens == 24


async def test_a_draft_model_of_another_vocabulary_is_refused_at_load(
    tiny_model: Path, tmp_path: Path
) -> None:
    from mlx_nursery.tools import make_model

    foreign = make_model(tmp_path / "thinking", "tiny-thinking")  # other added tokens
    spec = Speculation("draft", draft_model=str(foreign))
    with pytest.raises(ExceptionGroup) as failure:  # the load's, from the engine's nursery
        async with open_engine(_config(tiny_model, speculation=spec)):
            pass
    assert failure.group_contains(DraftModelMismatch, match="tokenizer differs")


def test_speculation_settings_pair_the_method_and_the_draft_model() -> None:
    with pytest.raises(ValueError, match="draft model"):
        Speculation("draft")
    with pytest.raises(ValueError, match="draft model"):
        Speculation("ngram", draft_model="somewhere")


def _tries(recurring: bool, steps: int) -> list[int]:
    """The steps at which a control whose drafts are never kept tries a draft, its context
    recurring (a copy's sign) or not."""
    costs = VerifyCosts()
    costs.plain(0.010)
    costs.verify(1, 0.030)  # a verify costs three plain steps: a draft must hold to pay
    control = DraftControl(8, costs)
    tried = []
    for step in range(steps):
        if control.drafts(recurring=recurring):
            tried.append(step)
            control.verified(1, 0)
    return tried


def test_a_pause_yields_to_a_recurring_context_after_its_first_steps() -> None:
    """A pause doubles after each try that did not pay, and a run of copied text often
    starts inside a long one; where the context's last n-gram recurs (a copy's sign) a pause
    that has run FIRST_PAUSE steps ends for a try, so tries come at least every
    FIRST_PAUSE + 1 steps, and no oftener where they keep failing."""
    quiet, copying = _tries(False, 200), _tries(True, 200)
    gaps = [b - a for a, b in itertools.pairwise(copying)]
    assert gaps and max(gaps) <= FIRST_PAUSE + 2 and min(gaps) > FIRST_PAUSE
    quiet_gaps = [b - a for a, b in itertools.pairwise(quiet)]
    assert max(quiet_gaps) >= 4 * FIRST_PAUSE  # the pauses doubled
    assert len(quiet) < len(copying)


def test_the_index_says_when_the_context_recurs() -> None:
    index = NgramIndex(Speculation(ngram_max=3), [1, 2, 3, 4, 5])
    assert not index.recurs()
    index.extend([9, 1, 2])
    assert not index.recurs()  # only two tokens of an earlier run
    index.extend([3])
    assert index.recurs()  # 1 2 3 occurred before, with 4 after it
