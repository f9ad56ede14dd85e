"""What rank 0 tells the other ranks: its batch's operations, in its order, as JSON lists.

A record is a list of operations, sent before each step (ending with `step`), as a
heartbeat while idle (no `step`), and last at shutdown:

- `["insert", uid, prompt, cache_tokens, max_tokens, stop_ids]`: a sequence enters the
  batch (the uid is rank 0's; a follower checks it gets the same one);
- `["remove", uids]`: sequences leave it (cancelled, stopped on text, preempted);
- `["reset"]`: the batch was closed (after a failed step, or at shutdown) and a new one made;
- `["step"]`: run one step;
- `["shutdown", failed]`: exit, non-zero if rank 0's engine failed.

The first record is the hello (a JSON object: the batch's settings), after the model check.
"""

from __future__ import annotations

from typing import Any

import attrs
import mlx.core as mx

from ..engine import EngineConfig

Op = list[Any]


@attrs.frozen
class Hello:
    """The settings every rank's batch must share, from rank 0's engine config."""

    max_concurrency: int
    prefill_batch_size: int
    prefill_step_size: int
    kv_bits: int | None
    kv_group_size: int
    kv_cache_bytes: int | None

    @classmethod
    def of(cls, config: EngineConfig) -> Hello:
        return cls(
            config.max_concurrency,
            config.prefill_batch_size,
            config.chunk_tokens(),
            config.kv_bits,
            config.kv_group_size,
            config.kv_cache_bytes,
        )


def kv_offer(kv_bytes: int | None, per_token: int) -> list[int]:
    """What a rank tells rank 0 of its KV memory: its bytes (-1: no limit) and what a token
    costs in its own caches (tensor ranks hold a slice of every layer's, pipeline ranks
    their layers')."""
    return [-1 if kv_bytes is None else kv_bytes, per_token]


def agreed_kv_bytes(offers: list[list[int]]) -> int | None:
    """From every rank's `kv_offer` (rank 0's first): the KV bytes, at rank 0's cost a
    token, for the fewest tokens any rank can hold (None: no rank has a limit; a rank
    whose KV does not grow with tokens limits none)."""
    tokens = [kv_bytes // cost for kv_bytes, cost in offers if kv_bytes >= 0 and cost > 0]
    return min(tokens) * offers[0][1] if tokens else None


def share_tokens(tokens: mx.array, group: mx.distributed.Group) -> mx.array:
    """Rank 0's sampled tokens on every rank, inside the step's graph (others add zeros)."""
    return mx.distributed.all_sum(tokens.astype(mx.uint32), group=group)


def shared_tokens(rows: int, group: mx.distributed.Group) -> mx.array:
    """A follower's side of `share_tokens`: rank 0's tokens for a step's `rows` rows."""
    return mx.distributed.all_sum(mx.zeros((rows,), mx.uint32), group=group)
