"""What a model reserves of the memory budget (`serving/_reservations.py`): the prefix
cache's default grows with the model's share, so that a long agent prompt is kept where the
device has room, and never drops below the engine's own default where it has little."""

from __future__ import annotations

import pytest

from mlx_nursery.generation import Overloaded
from mlx_nursery.models import ModelFacts
from mlx_nursery.serving._reservations import MemoryPlan

GIB = 1 << 30
WEIGHTS = 16 * GIB  # an 8B model in bf16


def plan(
    budget: int | None, *, prefix: int | None = None, models: int = 1, kv: int | None = None
) -> MemoryPlan:
    return MemoryPlan(
        max_loaded=models,
        budget=budget,
        kv_cache_bytes=kv,
        prompt_cache_bytes=prefix,
        max_concurrency=32,
    )


def text_model(weights: int = WEIGHTS) -> ModelFacts:
    return ModelFacts(kind="lm", context_length=131072, weight_bytes=weights)


def test_a_large_card_gives_the_prefix_cache_a_quarter_of_what_the_weights_leave() -> None:
    reservation = plan(120 * GIB).reservation("m", text_model())
    assert reservation.prefix_cache == 26 * GIB  # (120 - 16) / 4
    assert reservation.kv == 78 * GIB
    assert reservation.total == 120 * GIB


def test_a_small_share_keeps_the_engines_two_gib() -> None:
    reservation = plan(24 * GIB).reservation("m", text_model())
    assert reservation.prefix_cache == 2 * GIB  # a quarter of 8 GiB is no more
    assert reservation.kv == 6 * GIB


def test_the_share_is_per_loaded_model() -> None:
    reservation = plan(120 * GIB, models=2).reservation("m", text_model())
    assert reservation.prefix_cache == (60 - 16) * GIB // 4


def test_an_unknown_budget_and_an_explicit_size_are_taken_as_they_are() -> None:
    assert plan(None).reservation("m", text_model()).prefix_cache == 2 * GIB
    assert plan(120 * GIB, prefix=0).reservation("m", text_model()).prefix_cache == 0
    explicit = plan(120 * GIB, prefix=GIB).reservation("m", text_model())
    assert (explicit.prefix_cache, explicit.kv) == (GIB, 103 * GIB)


def test_a_model_without_a_kv_cache_reserves_no_prefix_cache() -> None:
    facts = ModelFacts(kind="embedding", context_length=512, weight_bytes=GIB)
    assert plan(120 * GIB).reservation("e", facts).prefix_cache == 0


def test_a_share_the_floor_does_not_fit_is_refused_naming_the_prefix_cache() -> None:
    with pytest.raises(Overloaded, match="prefix cache"):
        plan(17 * GIB).reservation("m", text_model())


def test_beside_an_explicit_kv_budget_the_prefix_cache_takes_a_quarter_of_what_it_leaves() -> None:
    """A KV budget that fitted with the 2 GiB of before still fits: the default is taken
    from what the weights and the KV budget leave, not from the whole share."""
    reservation = plan(100 * GIB, kv=70 * GIB).reservation("m", text_model())
    assert reservation.prefix_cache == (100 - 70 - 16) * GIB // 4
    assert reservation.total <= 100 * GIB
    tight = plan(100 * GIB, kv=82 * GIB).reservation("m", text_model())
    assert tight.prefix_cache == 2 * GIB
