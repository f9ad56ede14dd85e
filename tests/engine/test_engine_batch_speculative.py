"""Speculative decoding inside the running batch: each row verifies its own drafts in one
batched forward, and every row's tokens are plain decoding's.

The requests run one by one on an engine without speculation (the reference), then together
on one that drafts a fixed number of tokens whenever a row's context offers some
(`adaptive=False`, so that verify steps run however their cost compares on this machine):
rows that repeat their prompt (drafts found, most accepted), a seeded sampled row, a row
with a logits processor (it decodes without drafts in the same forwards), rows that end
early on `max_tokens` or a stop token, a row that joins while the others speculate, and one
cancelled while they do. The invariant checker runs after every iteration (the suite's
environment turns it on).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio

from mlx_nursery.engine import (
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    Speculation,
    open_engine,
)
from mlx_nursery.engine._batch_drafting import BatchCosts, expected_tokens, fair
from mlx_nursery.engine._batch_speculating import BatchSpeculation
from mlx_nursery.engine._drafting import VerifyCosts
from tests.helpers import Run, collect, collect_all

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 3
CHAT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"
GREEDY = SamplingParams(temperature=0.0)


def _config(tiny_model: Path, **changes: object) -> EngineConfig:
    config = EngineConfig(
        tiny_model,
        max_concurrency=8,
        prefill_step_size=64,
        warmup=False,
        single_sequence_fast_path=False,  # every row in the batch, alone too
        prompt_cache_bytes=0,
    )
    return attrs.evolve(config, **changes)


def _tokenized(text: str, tiny_model: Path) -> tuple[int, ...]:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return tuple(load_tokenizer(tiny_model).encode(text))


async def test_batch_rows_verify_their_drafts_and_keep_plain_decodings_tokens(
    tiny_model: Path,
) -> None:
    code, chat = _tokenized(CODE, tiny_model), _tokenized(CHAT, tiny_model)
    requests = {
        "code": GenerationRequest(code, 40, GREEDY, ignore_eos=True, logprobs=2),
        "chat": GenerationRequest(chat, 32, GREEDY, ignore_eos=True),
        "seeded": GenerationRequest(
            code, 36, SamplingParams(temperature=0.8, top_p=0.9, seed=11), ignore_eos=True
        ),
        "penalized": GenerationRequest(
            code, 24, SamplingParams(temperature=0.0, repetition_penalty=1.2), ignore_eos=True
        ),
        "short": GenerationRequest(chat[:12], 7, GREEDY, ignore_eos=True),
        "joiner": GenerationRequest(code[5:], 20, GREEDY, ignore_eos=True),
        "cancelled": GenerationRequest(code, 200, GREEDY, ignore_eos=True),
    }
    async with open_engine(_config(tiny_model)) as plain:
        # The tiny model answers this with one token repeated, then another: drafts of the
        # first are accepted until the second, which ends the run as a stop token.
        hello = GenerationRequest(
            _tokenized("Hello world", tiny_model), 40, GREEDY, ignore_eos=True
        )
        free = await collect(plain, hello)
        stop = free.tokens[-1]
        assert free.tokens.index(stop) >= 5
        requests["stopped"] = attrs.evolve(hello, stop_token_ids=frozenset({stop}))
        reference = {name: await collect(plain, r) for name, r in requests.items()}
    spec = Speculation(tokens=4, adaptive=False)
    async with open_engine(_config(tiny_model, speculation=spec)) as engine:
        runs: dict[str, Run] = {}
        midway = trio.Event()
        cancelled_tokens: list[int] = []
        verifies_before_join: list[int] = []

        async def run(name: str) -> None:
            runs[name] = await collect(engine, requests[name])

        async def join_late() -> None:
            await midway.wait()
            verifies_before_join.append(_drafts(engine)[0])
            runs["joiner"] = await collect(engine, requests["joiner"])

        async def cancel_midway() -> None:
            with trio.CancelScope() as scope:
                async with engine.generate(requests["cancelled"]) as stream:
                    async for event in stream:
                        if event.token_id is not None:
                            cancelled_tokens.append(event.token_id)
                        if len(cancelled_tokens) == 8:
                            midway.set()
                        if len(cancelled_tokens) == 15:
                            scope.cancel()
            assert stream.steps_in_flight_at_cancel is not None
            assert stream.steps_in_flight_at_cancel <= 1

        async with trio.open_nursery() as nursery:
            for name in ("code", "chat", "seeded", "penalized", "short", "stopped"):
                nursery.start_soon(run, name)
            nursery.start_soon(join_late)
            nursery.start_soon(cancel_midway)
        stats = engine.statistics()
        assert stats.lanes_borrowed == 0 and stats.late_events == 0
        worker = stats.worker
        assert worker is not None
        verify_steps, drafted, accepted = _drafts(engine)
    for name in ("code", "chat", "seeded", "penalized", "short", "joiner", "stopped"):
        assert runs[name].tokens == reference[name].tokens, name
        assert runs[name].final.finish_reason == reference[name].final.finish_reason, name
    assert runs["stopped"].final.finish_reason == "stop"
    assert len(runs["short"].tokens) == 7
    assert 15 <= len(cancelled_tokens) < 200
    assert cancelled_tokens == reference["cancelled"].tokens[: len(cancelled_tokens)]
    assert verify_steps > verifies_before_join[0] > 0  # it joined while rows speculated
    assert drafted > 0 and 0 < accepted < drafted
    usage = runs["code"].final.usage
    assert usage is not None and usage.completion_tokens == 40
    assert usage.draft_tokens > 0 and usage.accepted_draft_tokens > 0
    penalized = runs["penalized"].final.usage
    assert penalized is not None and penalized.draft_tokens == 0  # a processor: no drafts
    for ours, theirs in zip(runs["code"].events, reference["code"].events, strict=True):
        assert ours.logprob is not None and theirs.logprob is not None
        assert ours.logprob.logprob == pytest.approx(theirs.logprob.logprob, abs=1e-4)
        assert [t for t, _ in ours.logprob.top] == [t for t, _ in theirs.logprob.top]


def _drafts(engine: object) -> tuple[int, int, int]:
    worker = engine.statistics().worker  # type: ignore[attr-defined]
    assert worker is not None
    return worker.verify_steps, worker.draft_tokens, worker.accepted_draft_tokens


def test_a_verify_step_is_cut_so_that_no_row_pays_for_anothers_drafts() -> None:
    costs = VerifyCosts()
    assert fair([[1, 2], []], [0.9, None], costs) == [[1, 2], []]  # unknown: a try
    costs.plain(0.010)
    costs.verify(4, 0.010 + 4 * 0.0001)  # a GPU: a drafted position costs 1% of a step
    assert fair([[1, 2, 3, 4], [5]], [0.9, 0.5], costs) == [[1, 2, 3, 4], [5]]
    # A row without drafts may lose at most 5%: five positions at 1% each is the most.
    costs = VerifyCosts()
    costs.plain(0.010)
    costs.verify(4, 0.010 + 4 * 0.0002)  # 2%: two drafts at most beside a plain row
    costs.verify(1, 0.010 + 0.0002)
    assert fair([[1, 2, 3, 4], []], [0.9, None], costs) == [[1, 2], []]
    linear = VerifyCosts()  # this CPU: a drafted position costs about a step
    linear.plain(0.010)
    linear.verify(4, 0.050)
    linear.verify(1, 0.020)
    assert fair([[1, 2, 3, 4], [5, 6]], [0.95, 0.95], linear) == [[], []]
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    sizes = BatchCosts()
    assert sizes.at(3) is sizes.at(4) and sizes.at(5) is not sizes.at(4)
    assert sizes.select(8) is sizes.at(7) and sizes.step_seconds(0) is None


def _decode_pair(
    tiny_model: Path, costs: tuple[float, float], length: int = 24
) -> tuple[list[list[int]], int, float | None]:
    """Two greedy rows of the code prompt through a batch stepper whose speculation is
    adaptive and whose costs for two rows start as `costs` (a plain step, a verify of 4
    drafts); their tokens, the verify steps run and the cost of a draft at the end."""
    from mlx_lm.utils import load

    from mlx_nursery.engine._sequence import LiveSequence
    from mlx_nursery.engine._stepper import BatchStepper, Start
    from mlx_nursery.engine._upstream import greedy_sampler

    model, _ = load(str(tiny_model))
    verifies: list[int] = []
    stepper = BatchStepper(
        model,
        max_concurrency=2,
        prefill_batch_size=2,
        prefill_step_size=64,
        speculation=Speculation(tokens=4),
        verified=lambda sequence, drafted, accepted: verifies.append(drafted),
    )
    speculation = stepper._speculation
    assert speculation is not None
    speculation.costs.at(2).plain(costs[0])
    speculation.costs.at(2).verify(4, costs[1])
    prompt = list(_tokenized(CODE, tiny_model))
    tokens: dict[int, list[int]] = {}
    for seq_id in range(2):
        request = GenerationRequest(prompt, length, GREEDY, ignore_eos=True)
        live = LiveSequence(seq_id, request, greedy_sampler, [], frozenset(), failures=[])
        tokens[stepper.insert(live, Start(prompt, None, [], length))] = []
    done: set[int] = set()
    while len(done) < 2:
        for response in stepper.step():
            tokens[response.uid].append(int(response.token))
            if response.finish_reason is not None:
                done.add(response.uid)
    assert not stepper.uids and not stepper.drafting
    stepper.close()
    return list(tokens.values()), len(verifies), speculation.costs.at(2).step_seconds(4)


def test_the_batch_drafts_where_the_costs_say_it_pays_and_not_where_they_do_not(
    tiny_model: Path,
) -> None:
    """The adaptive control inside the batch (real forwards, the costs seeded): drafted
    positions at 1% of a step each (a GPU) are drafted; at a whole step each (this CPU)
    none are. The tokens are the same either way."""
    cheap, cheap_verifies, _ = _decode_pair(tiny_model, (0.010, 0.0104))
    linear, linear_verifies, _ = _decode_pair(tiny_model, (0.010, 0.050))
    assert cheap == linear and len(cheap[0]) == 24
    assert cheap_verifies > 0 and linear_verifies == 0


def test_costs_measured_under_a_stall_do_not_stop_the_batch_drafting_for_good(
    tiny_model: Path,
) -> None:
    """A verify timed under a stall (here: seeded at a second for 4 drafts) says drafts never
    pay; the batch still tries one now and then, spaced out, and learns the real cost."""
    stalled = 1.0
    tokens, retries, verify_4 = _decode_pair(tiny_model, (0.010, stalled), length=600)
    assert len(tokens[0]) == 600 and tokens[0] == tokens[1]
    assert retries >= 2  # the first run of a verify's shape teaches nothing
    assert verify_4 is not None and verify_4 < stalled / 2


def test_a_verify_shapes_first_run_teaches_no_cost() -> None:
    """A shape's first run may build its kernels: its time is not the shape's cost."""
    costs = VerifyCosts()
    costs.plain(0.010)
    costs.observed(8, 1, 0.900)  # the first verify of 8 rows and one draft: a build
    assert costs.step_seconds(1) is None
    costs.observed(8, 1, 0.011)
    assert costs.step_seconds(1) == pytest.approx(0.011)
    costs.observed(4, 1, 0.500)  # another shape's first run
    assert costs.step_seconds(1) == pytest.approx(0.011)


def test_an_untimed_verify_is_its_shapes_first_run_too() -> None:
    """A busy batch's verify (not quiet: untimed) still builds its shape's kernels, so the
    next, quiet, verify of that shape is a cost the batch learns, not a second first run."""
    speculation = BatchSpeculation(Speculation(tokens=4), None, {})
    costs = speculation.costs.at(2)
    costs.plain(0.010)
    speculation._timed("verify", 2, 1, quiet=False)  # a prefill chunk ran beside it
    for _ in range(2):
        speculation._timed("plain", 2, 0, quiet=True)
    assert costs.step_seconds(1) is None
    speculation._timed("verify", 2, 1, quiet=True)
    assert costs.step_seconds(1) is not None


def test_each_batch_size_tries_its_first_verify_soon_however_many_sizes_came_before() -> None:
    """A batch size whose verify cost is unknown tries one within `FIRST_PAUSE` steps of the
    last try, however many other sizes, and row counts within a size, tried before it: each
    try here runs in a busy batch (untimed), and only a try of a shape that has run before
    (so that only the busy batch kept it from teaching) doubles its size's wait. One wait for
    all sizes had the fourth size wait eight times as long; a doubling per untimed try had
    rows drifting within a size (5, 6, 7, 8) wait 8, 16, 32 and 64 steps."""
    import types

    from mlx_nursery.engine._batch_drafting import RowDrafter
    from mlx_nursery.engine._drafting import FIRST_PAUSE, DraftControl, NgramIndex
    from mlx_nursery.engine._ragged import RaggedBatchKVCache

    spec = Speculation(tokens=4)
    speculation = BatchSpeculation(spec, None, {})
    context = [1, 2, 3, 4, 5] * 4  # every row's lookup finds drafts

    def wait_for_a_try(rows: int) -> int:
        """Steps of a batch of `rows` until it tries a verify, which then runs untimed."""
        speculation.costs.at(rows).plain(0.010)  # a plain step's cost known, no verify's
        for uid in range(rows):
            if uid not in speculation._rows:
                control = DraftControl(spec.tokens, speculation.costs)
                index = NgramIndex(spec, context)
                speculation._rows[uid] = RowDrafter(index, control, None, lambda d, a: None)  # type: ignore[arg-type]
        batch = types.SimpleNamespace(
            uids=list(range(rows)),
            prompt_cache=[RaggedBatchKVCache([0] * rows)],
            max_tokens=[1000] * rows,
            _num_tokens=[0] * rows,
            tokens=[context] * rows,
        )
        for step in range(1, 300):
            speculation._since_try += 1  # as `decode` counts each step
            drafts = speculation._plan(batch)
            if drafts is not None:
                assert max(map(len, drafts)) == 1  # a try drafts one token
                speculation._timed("verify", rows, 1, quiet=False)  # busy: untimed
                return step
        raise AssertionError(f"a batch of {rows} never tried")

    waits = [wait_for_a_try(rows) for rows in (2, 4, 5, 6, 7, 8, 16, 32)]
    assert waits[0] <= 1 and max(waits) <= FIRST_PAUSE, waits
    # The same shape again: its first try ran (untimed), so this one waits as long; from
    # then on each untimed try of it doubles the wait.
    assert [wait_for_a_try(32) for _ in range(3)] == [FIRST_PAUSE, 2 * FIRST_PAUSE, 4 * FIRST_PAUSE]


async def test_a_draft_model_drafts_for_every_row_of_the_batch(tiny_model: Path) -> None:
    """`--draft-model` in the batch: the draft model drafts for every row at once (here the
    served model itself, so greedy drafts agree) and the tokens stay plain decoding's."""
    prompt = _tokenized("Once upon a time, in a land far away,", tiny_model)
    requests = [
        GenerationRequest(prompt, 16, GREEDY, ignore_eos=True),
        GenerationRequest(prompt[:6], 16, GREEDY, ignore_eos=True),
        GenerationRequest(prompt, 16, SamplingParams(temperature=0.8, seed=5), ignore_eos=True),
    ]
    async with open_engine(_config(tiny_model)) as plain:
        reference = [await collect(plain, r) for r in requests]
    spec = Speculation("draft", tokens=3, adaptive=False, draft_model=str(tiny_model))
    async with open_engine(_config(tiny_model, speculation=spec)) as engine:
        runs = await collect_all(engine, requests)
        verify_steps, drafted, accepted = _drafts(engine)
    assert [r.tokens for r in runs] == [r.tokens for r in reference]
    assert verify_steps > 0 and drafted >= accepted > 0
    for greedy in runs[:2]:  # the served model drafting for itself: every greedy draft holds
        usage = greedy.final.usage
        assert usage is not None and usage.accepted_draft_tokens == usage.draft_tokens > 0


def test_batched_draft_model_rounds_draft_what_each_row_would_alone(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`BatchModelDrafter` keeps every row's draft KV exact through what a batch does to it:
    rows joining with long contexts (fed in chunks), rejected drafts trimmed per row, a next
    input still computing (its guess dropped), rows asking none, a row leaving and one
    missing a round (filtered, then prefilled again), and padding compacted. Each round's
    drafts equal the ones `ModelDrafter` gives the row alone."""
    import random

    from mlx_nursery.engine._batch_model_drafting import BatchModelDrafter, DraftAsk, batchable
    from mlx_nursery.engine._draft_model import ModelDrafter
    from mlx_nursery.models import load_model

    monkeypatch.setattr("mlx_nursery.engine._batch_model_drafting.COMPACT_PADDING", 3)
    model = load_model(tiny_model).model
    assert batchable(model)
    rng = random.Random(7)
    base = list(_tokenized(CODE, tiny_model))
    contexts = {0: base[:9], 1: (base * 20)[:700], 2: base[:2]}
    alone = {uid: ModelDrafter(model, context) for uid, context in contexts.items()}
    batch = BatchModelDrafter(model)
    for round_ in range(10):
        if round_ == 3:
            contexts[3] = (base * 12)[:530]
            alone[3] = ModelDrafter(model, contexts[3])
        if round_ == 6:
            del contexts[0], alone[0]
            batch.drop(0)
        missing = 2 if round_ == 4 else None
        asks: dict[int, DraftAsk] = {}
        for uid, context in contexts.items():
            known = None if rng.random() < 0.3 else rng.randrange(64)
            most = 0 if uid == 1 and round_ % 3 == 1 else rng.randint(1, 4)
            asks[uid] = DraftAsk(context, known, most)
        drafted = batch.draft({u: a for u, a in asks.items() if u != missing})
        assert batch.uids == set(contexts) - {missing}
        assert batch._cache is not None and min(batch._cache[0].padding) < 3  # compacted
        for uid, ask in asks.items():
            if uid == missing:
                continue
            solo = alone[uid]
            if ask.known is None:
                want = solo.draft(ask.most + 1)[1:] if ask.most else []
            else:
                solo.extend([ask.known])
                want = solo.draft(ask.most)
            assert drafted[uid] == want, (round_, uid)
            # The verify keeps a prefix of the drafts and draws the next token itself.
            kept = drafted[uid][: rng.randint(0, len(drafted[uid]))]
            confirmed = ([] if ask.known is None else [ask.known]) + kept
            contexts[uid] = list(contexts[uid]) + confirmed + [rng.randrange(64)]
            solo.extend(kept + contexts[uid][-1:])
        if missing is not None:  # it confirmed tokens while it did not draft
            contexts[missing] = [*contexts[missing], 5, 6]
            alone[missing].extend([5, 6])
    batch.drop(1)
    batch.drop(2)
    batch.drop(3)
    assert batch.uids == frozenset() and batch._cache is None


def test_a_verify_after_a_plain_step_costs_its_whole_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A verify after a plain step emits that step's token too (each row's first), which the
    control counts as the "1" of its 1 + a + ...: the interval is the verify's whole cost, not
    less a plain step (which made drafts look nearly free where the host builds each step)."""
    import types

    from mlx_nursery.engine import _batch_speculating

    clock = [0.0]
    monkeypatch.setattr(
        _batch_speculating, "time", types.SimpleNamespace(perf_counter=lambda: clock[0])
    )
    speculation = BatchSpeculation(Speculation(tokens=4), None, {})
    for kind, seconds in [("plain", 0.0), ("plain", 0.010), ("plain", 0.010), ("verify", 0.013)]:
        clock[0] += seconds
        speculation._timed(kind, 2, 1 if kind == "verify" else 0, quiet=True)  # type: ignore[arg-type]
    for kind, seconds in [("plain", 0.010), ("plain", 0.010), ("verify", 0.013)]:
        clock[0] += seconds
        speculation._timed(kind, 2, 1 if kind == "verify" else 0, quiet=True)  # type: ignore[arg-type]
    costs = speculation.costs.at(2)
    assert costs.step_seconds(0) == pytest.approx(0.010)
    assert costs.step_seconds(1) == pytest.approx(0.013)
