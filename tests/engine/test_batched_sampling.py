"""A batch's rows sampled in one computation draw exactly what each row's sampler draws
alone, whatever else is in the batch; a row that cannot be batched falls back row by row."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlx_nursery.engine import SamplingParams
from mlx_nursery.engine._sampling import (
    GuardedSampler,
    KeyedSampler,
    make_request_sampler,
    sample_batch,
)

VOCAB = 300
PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, seed=1),
    SamplingParams(temperature=1.3, seed=2, top_p=0.8),
    SamplingParams(temperature=0.9, seed=3, min_p=0.05),
    SamplingParams(temperature=1.0, seed=4, top_k=20),
    SamplingParams(temperature=0.5, seed=5, top_p=0.9, min_p=0.01, top_k=50),
    SamplingParams(temperature=1.0, seed=6, top_k=VOCAB),
]


def logprobs_for(rows: int, step: int) -> mx.array:
    logits = mx.random.normal((rows, VOCAB), key=mx.random.key(1000 + step))
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def test_batched_draws_equal_lone_draws_over_many_steps() -> None:
    batched = [make_request_sampler(p, []) for p in PARAMS]
    alone = [make_request_sampler(p, []) for p in PARAMS]
    for step in range(40):
        logprobs = logprobs_for(len(PARAMS), step)
        together = sample_batch(batched, logprobs).tolist()
        apart = [alone[i](logprobs[i : i + 1]).item() for i in range(len(PARAMS))]
        assert together == apart, f"step {step}"


def test_a_row_draws_the_same_in_any_company() -> None:
    """Row 1's draws do not depend on which rows share its batch, nor on its position."""
    reference = make_request_sampler(PARAMS[1], [])
    company = [make_request_sampler(p, []) for p in PARAMS]
    for step in range(10):
        logprobs = logprobs_for(len(PARAMS), step)
        mine = logprobs[1:2]
        expected = reference(mine).item()
        reversed_rows = list(reversed(company))
        stacked = mx.concatenate([logprobs[::-1][: len(PARAMS) - 2], mine, logprobs[:1]])
        drawn = sample_batch([*reversed_rows[: len(PARAMS) - 2], company[1], company[0]], stacked)
        assert drawn.tolist()[len(PARAMS) - 2] == expected


def test_seeds_reproduce_and_differ() -> None:
    logprobs = logprobs_for(1, 0)
    first = [make_request_sampler(SamplingParams(temperature=1.0, seed=9), []) for _ in range(2)]
    other = make_request_sampler(SamplingParams(temperature=1.0, seed=10), [])
    draws = [[s(logprobs).item() for _ in range(30)] for s in (*first, other)]
    assert draws[0] == draws[1] and draws[0] != draws[2]


def test_a_rewound_sampler_draws_again_what_it_drew() -> None:
    sampler = make_request_sampler(SamplingParams(temperature=1.0, seed=11), [])
    logprobs = logprobs_for(1, 3)
    drawn = [sampler(logprobs).item() for _ in range(5)]
    assert isinstance(sampler, GuardedSampler) and isinstance(sampler.sampler, KeyedSampler)
    sampler.rewind(2)
    assert [sampler(logprobs).item() for _ in range(3)] == drawn[2:]


def test_a_sampler_of_another_kind_makes_the_step_row_by_row() -> None:
    def always_seven(logprobs: mx.array) -> mx.array:
        return mx.full(logprobs.shape[:-1], 7, dtype=mx.uint32)

    keyed = make_request_sampler(PARAMS[1], [])
    alone = make_request_sampler(PARAMS[1], [])
    logprobs = logprobs_for(2, 5)
    drawn = sample_batch([always_seven, keyed], logprobs).tolist()
    assert drawn == [7, alone(logprobs[1:2]).item()]


def test_a_failing_row_is_guarded_alone_when_the_batched_draw_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlx_nursery.engine import _sampling

    real = _sampling.key_words

    def key_words(seed: int, draw: int) -> tuple[int, int]:
        if seed == 666:
            raise RuntimeError("this row's key broke")
        return real(seed, draw)

    monkeypatch.setattr(_sampling, "key_words", key_words)
    failures: list[BaseException] = []
    doomed = make_request_sampler(SamplingParams(temperature=1.0, seed=666), failures)
    healthy = make_request_sampler(PARAMS[1], [])
    alone = make_request_sampler(PARAMS[1], [])
    logprobs = logprobs_for(2, 6)
    drawn = sample_batch([doomed, healthy], logprobs).tolist()
    assert len(failures) == 1 and "broke" in str(failures[0])
    assert drawn == [mx.argmax(logprobs[0]).item(), alone(logprobs[1:2]).item()]


BIASED = [
    SamplingParams(temperature=0.0, logit_bias={5: 40.0, 6: -100.0}),
    SamplingParams(temperature=0.8, seed=21, logit_bias={7: 3.0, 8: 2.5, 9: -100.0}),
    SamplingParams(temperature=1.1, seed=22, top_p=0.9, logit_bias={10: 4.0}),
    SamplingParams(temperature=0.7, seed=23),  # no bias, beside biased rows
]


def test_biased_rows_in_a_batch_draw_what_they_draw_alone_and_follow_their_bias() -> None:
    batched = [make_request_sampler(p, []) for p in BIASED]
    alone = [make_request_sampler(p, []) for p in BIASED]
    drawn: list[list[int]] = []
    for step in range(40):
        logprobs = logprobs_for(len(BIASED), step)
        together = sample_batch(batched, logprobs).tolist()
        assert together == [alone[i](logprobs[i : i + 1]).item() for i in range(len(BIASED))]
        drawn.append(together)
    assert all(row[0] == 5 for row in drawn)  # +40 on token 5 outweighs any normal logit
    assert not any(row[1] == 9 for row in drawn)  # -100 is as good as a ban
    assert sum(row[1] in (7, 8) for row in drawn) > 2  # pulled up from 2 of 300 tokens


def test_a_batch_whose_rows_change_draws_with_its_own_rows_biases() -> None:
    """The bias arrays a step made are kept for the next steps of the same rows: rows
    joining, leaving or reordered, and new requests with equal biases, get their own."""
    samplers = [make_request_sampler(p, []) for p in BIASED]
    alone = [make_request_sampler(p, []) for p in BIASED]
    orders = [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3], [2, 0, 1], [0, 1, 2, 3]]
    for step in range(30):
        order = orders[step % len(orders)]
        if step == 20:  # new requests, equal parameters: equal biases, other objects
            samplers = [make_request_sampler(p, []) for p in BIASED]
            alone = [make_request_sampler(p, []) for p in BIASED]
        logprobs = logprobs_for(len(order), step)
        together = sample_batch([samplers[i] for i in order], logprobs).tolist()
        assert together == [alone[i](logprobs[k : k + 1]).item() for k, i in enumerate(order)]
        if 0 in order:
            assert together[order.index(0)] == 5  # +40 on token 5: row 0's bias, wherever it sits


def test_a_biased_draw_is_the_draw_from_the_biased_logits() -> None:
    """What the sampler does with a bias is what mlx-lm's logit-bias processor followed by
    an unbiased sampler does (the distribution they draw from is the same)."""
    from mlx_lm.sample_utils import make_logits_processors

    params = BIASED[1]
    (processor,) = make_logits_processors(logit_bias=dict(params.logit_bias or {}))
    with_bias = make_request_sampler(params, [])
    reference = make_request_sampler(attrs_evolve(params, logit_bias=None), [])
    for step in range(20):
        logits = mx.random.normal((1, VOCAB), key=mx.random.key(2000 + step))
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        biased = processor(mx.array([]), logits)
        biased = biased - mx.logsumexp(biased, axis=-1, keepdims=True)
        assert with_bias(logprobs).item() == reference(biased).item()


def test_a_bias_is_a_processor_only_for_a_request_told_its_logprobs() -> None:
    from mlx_nursery.engine import GenerationRequest
    from mlx_nursery.engine._messages import Submit
    from mlx_nursery.engine._sequence import build_sequence

    sampling = SamplingParams(temperature=0.7, seed=3, logit_bias={5: 2.0})
    plain = build_sequence(Submit(0, GenerationRequest([1, 2], 4, sampling=sampling)), frozenset())
    told = build_sequence(
        Submit(1, GenerationRequest([1, 2], 4, sampling=sampling, logprobs=0)), frozenset()
    )
    assert plain.processors == [] and len(told.processors) == 1


def attrs_evolve(params: SamplingParams, **changes: object) -> SamplingParams:
    import attrs

    return attrs.evolve(params, **changes)
