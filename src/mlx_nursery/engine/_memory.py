"""The KV memory budget: how many tokens of KV the running sequences may hold at once.

mlx-lm's batch keeps every sequence's keys and values in one array per layer, as long as
the batch's longest sequence (shorter ones are left-padded) and grown in steps of 256
tokens. So what a batch holds is `rows x longest`, not the sum of its lengths: one 8K-token
prompt among 31 short ones makes every row 8K long. `KVBudget` counts that way, so the
engine can hold an arrival back, or take the newest sequence out of the batch to replay it
later, before the batch outgrows memory instead of after (an out-of-memory error fails the
step of everyone in the batch, and on some backends the process).

The budget is in tokens: bytes divided by what one token's KV costs in this model, measured
on the loaded model (`kv_bytes_per_token`). Transient memory (a prefill chunk's attention,
the copy made while a prompt joins the batch) is not counted: the derived default leaves
room for it (`derive_kv_bytes`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs
import mlx.core as mx

from ._upstream import make_prompt_cache

KV_STEP = 256
"""mlx-lm's KV caches grow in steps of this many tokens."""

MIN_KV_TOKENS = 2 * KV_STEP
"""The smallest KV budget served (a context of one step): below it nothing useful fits."""

DEVICE_MEMORY_FRACTION = 0.8
"""Of the device's memory (Metal: its recommended working set) that weights, the prefix
cache and KV may use together by default; the rest is for transient buffers and the OS."""


def whole_steps(tokens: int) -> int:
    """`tokens` rounded up to whole KV steps: what a cache grown in steps holds for them."""
    return KV_STEP * -(-tokens // KV_STEP)


@attrs.frozen
class KVBudget:
    """At most `tokens` of KV (rows x longest, as mlx-lm's batch holds them); None: no limit."""

    tokens: int | None

    @staticmethod
    def footprint(lengths: Collection[int]) -> int:
        """Tokens a batch of sequences of these lengths holds (each grown by one step ahead)."""
        if not lengths:
            return 0
        return len(lengths) * whole_steps(max(lengths) + 1)

    def fits(self, lengths: Collection[int], *, growth: int = 0) -> bool:
        """Whether sequences of these lengths can run together, each `growth` tokens longer.
        One alone always can: the served context length is capped by the budget
        (`served_context`). The engine admits with a step of growth and preempts with one
        token's, so that a sequence it admits is not preempted at once."""
        if self.tokens is None or len(lengths) <= 1:
            return True
        return self.footprint([n + growth for n in lengths]) <= self.tokens

    def served_context(self, model_context: int) -> int:
        """The longest sequence served: the model's context, or less if KV memory is short."""
        if self.tokens is None:
            return model_context
        return max(1, min(model_context, self.tokens - KV_STEP))


def kv_budget(kv_bytes: int, per_token: int, model_context: int, max_sequences: int) -> KVBudget:
    """The KV budget that `kv_bytes` buy at `per_token` bytes a token: never below
    `MIN_KV_TOKENS`, and never above what `max_sequences` sequences as long as the context
    hold at once, each with a step of room to grow (the most the engine's admission ever
    asks for: memory past it would never be used, so it is neither counted nor reported as
    reserved). The engine and the model list before a load both derive the served context
    from it (`served_context`)."""
    tokens = max(kv_bytes // per_token, MIN_KV_TOKENS)
    most = max_sequences * KVBudget.footprint([model_context + KV_STEP])
    return KVBudget(min(tokens, most))


def kv_bytes_per_token(model: Any, make_cache: Callable[[Any], list[Any]] | None = None) -> int:
    """What one token's keys and values cost in `model`, across its layers, in bytes (0 for
    a model with no growing KV cache), in caches as `make_cache` makes them (default:
    mlx-lm's; a quantized cache's keys are arrays of parts, all counted). Runs one token
    through a fresh cache: engine thread."""
    cache = (make_cache or make_prompt_cache)(model)
    model(mx.array([[0]]), cache=cache)
    per_token = 0.0
    for layer in cache:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None:
            continue  # a state of constant size (recurrent layers): not per token
        arrays = [*_parts(keys), *_parts(values)]
        per_token += sum(a.nbytes for a in arrays) / arrays[0].shape[2]
    return math.ceil(per_token)


def _parts(stored: mx.array | Sequence[mx.array]) -> tuple[mx.array, ...]:
    """A cache's keys (or values): one array, or a quantized one's packed values, scales
    and biases: a tuple, or a list on pipeline ranks but rank 0, where mlx-lm's pipelined
    models replace the last layer's keys with what `mx.depends` returns."""
    if isinstance(stored, mx.array):
        return (stored,)
    return tuple(stored)


def device_memory(info: Mapping[str, Any]) -> int | None:
    """Memory the device can give MLX, from `mx.device_info()`; the CPU reports none, so the
    machine's physical memory stands in."""
    for key in ("max_recommended_working_set_size", "memory_size", "total_memory"):
        value = info.get(key)
        if isinstance(value, int) and value > 0:
            return value
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def derive_kv_bytes(memory: int | None, weights: int, prompt_cache_bytes: int) -> int | None:
    """The default KV budget: `DEVICE_MEMORY_FRACTION` of the device's memory, less the
    weights and the prefix cache's budget (None when the memory is unknown). Never below
    zero; the caller's minimum applies."""
    if memory is None:
        return None
    return max(0, int(memory * DEVICE_MEMORY_FRACTION) - weights - prompt_cache_bytes)


BUFFER_CACHE_FRACTION = 0.1
"""Of the device's memory that MLX's cache of freed buffers may hold on CUDA: within the
share `DEVICE_MEMORY_FRACTION` leaves for transient buffers."""


def bound_buffer_cache(on_cuda: bool, memory: int | None) -> int | None:
    """On CUDA, limit MLX's cache of freed buffers to `BUFFER_CACHE_FRACTION` of the device's
    `memory`; the limit set (None: left as it was). Process-wide, so every engine thread
    may call it: each sets the same.

    Why: MLX keeps freed buffers up to nearly all of the device's memory, and CUDA's memory
    pool, which they come from, then holds the whole device; past that point MLX empties
    its cache at every allocation the cache cannot serve, so a busy batch's steps allocated
    from CUDA every time (docs/benchmarks.md, "MLX's buffer cache under a busy batch").
    Metal and the CPU keep MLX's default (not measured there)."""
    if not on_cuda or memory is None:
        return None
    limit = int(memory * BUFFER_CACHE_FRACTION)
    mx.set_cache_limit(limit)
    return limit


def default_memory_budget() -> int | None:
    """What the loaded models may reserve together when no budget is set:
    `DEVICE_MEMORY_FRACTION` of the device's memory (None when it is unknown). Reads
    device facts only, no model: any thread."""
    memory = device_memory(mx.device_info())
    return None if memory is None else int(memory * DEVICE_MEMORY_FRACTION)


def memory_in_use() -> int:
    """Bytes MLX holds in arrays now, all models and threads together (its own counter;
    freed buffers MLX keeps for reuse are not counted). Any thread."""
    return int(mx.get_active_memory())


def memory_in_cache() -> int:
    """Bytes of freed buffers MLX keeps for reuse (its own counter): memory the process
    holds that `memory_in_use` does not count. Any thread."""
    return int(mx.get_cache_memory())
