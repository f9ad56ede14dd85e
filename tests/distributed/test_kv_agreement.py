"""The group's KV budget: the fewest tokens any rank can hold, each rank's memory counted at
its own cost a token (pipeline ranks with more layers than others pay more a token)."""

from __future__ import annotations

import pytest

from mlx_nursery.distributed._ops import agreed_kv_bytes, kv_offer


@pytest.mark.parametrize(
    ("offers", "agreed"),
    [
        # Rank 0: 100 tokens; rank 1, less memory but half the layers: 120. Rank 0 limits.
        ([kv_offer(1000, 10), kv_offer(600, 5)], 1000),
        # Rank 1 at rank 0's cost a token: 60 tokens, in rank 0's bytes.
        ([kv_offer(1000, 10), kv_offer(600, 10)], 600),
        # Rank 1 pays more a token (an uneven split): 50 tokens at rank 0's 10 bytes.
        ([kv_offer(1000, 10), kv_offer(1000, 20)], 500),
        # No limit on rank 0; rank 1's 120 tokens, in rank 0's bytes.
        ([kv_offer(None, 10), kv_offer(600, 5)], 1200),
        # A rank with no growing KV limits nothing.
        ([kv_offer(1000, 10), kv_offer(0, 0)], 1000),
        ([kv_offer(None, 10), kv_offer(None, 5)], None),
    ],
)
def test_the_budget_is_the_fewest_tokens_any_rank_holds(
    offers: list[list[int]], agreed: int | None
) -> None:
    assert agreed_kv_bytes(offers) == agreed
