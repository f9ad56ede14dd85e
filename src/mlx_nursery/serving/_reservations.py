"""What a model reserves of the memory budget, and the context it serves: decided from the
model's files before it loads, so that the model list says before a load what it says after.

A reservation is a bound, not a guess: the engine holds its sequences' KV within its KV
budget (engine/_memory.py) and its prefix cache within its byte budget, and the weights are
what the model's files hold. Without `--kv-cache-bytes`, a model's KV budget is its share
of the memory budget (the budget over `--max-loaded-models`) less its weights and prefix
cache: so with the defaults (one model loaded, 80% of device memory) a model gets what a
server of one model always gave it. Without `--prompt-cache-bytes`, the prefix cache's
budget is a quarter of what that share leaves after the weights, at least
`MIN_PREFIX_CACHE_BYTES` (`default_prefix_cache`): a fixed size would hold an agent's
20,000-token prompt on no machine that serves an 8B model in bf16 (128 KiB a token), while a
large card's KV budget lies unused beside it.

That KV budget caps the context served (the engine serves no sequence its budget could
not hold alone). The engine measures a token's KV on the loaded model; before the load the
same cost follows from the model's config and weight dtype (`models/_kv_layout.py`), and
`served_context` runs the engine's own arithmetic on it (`engine.kv_budget`). Once loaded,
a model reserves what its engine can use (`held`): KV past what `--max-concurrency`
sequences of the served context hold is never used, so it is not kept from other models.
"""

from __future__ import annotations

import attrs

from ..engine import EngineConfig, ModelInfo, kv_budget
from ..generation import Overloaded
from ..models import ModelFacts


def _engine_prefix_cache() -> int:
    default = attrs.fields_dict(EngineConfig)["prompt_cache_bytes"].default
    assert isinstance(default, int)
    return default


MIN_PREFIX_CACHE_BYTES = _engine_prefix_cache()
"""The prefix cache's budget where the rule below gives less, or the memory is unknown: the
engine's own default (2 GiB), stated there once."""

PREFIX_CACHE_SHARE = 4
"""Without `--prompt-cache-bytes`, a model's prefix cache may take 1/this of what its share
of the memory budget leaves after its weights; the rest is its KV budget."""


def default_prefix_cache(share: int | None, weights: int) -> int:
    """The prefix cache's budget of a model whose share of the memory budget is `share`
    bytes (None: unknown; less an explicit KV budget where one is set) and whose weights
    take `weights`."""
    if share is None:
        return MIN_PREFIX_CACHE_BYTES
    return max(MIN_PREFIX_CACHE_BYTES, (share - weights) // PREFIX_CACHE_SHARE)


@attrs.frozen
class Reservation:
    """What a loaded model may hold, in bytes: its weights, its prefix cache's budget and
    its KV budget (None: the engine derives one; only without any memory budget)."""

    weights: int
    prefix_cache: int
    kv: int | None
    adapters: int = 0
    """Its LoRA adapters' matrices (`_adapters.py`), on top of the rest."""

    @property
    def total(self) -> int:
        return self.weights + self.prefix_cache + (self.kv or 0) + self.adapters

    def parts(self) -> dict[str, int]:
        """The reservation by part, as /metrics labels them (`model_reserved_bytes`)."""
        parts = {"weights": self.weights, "prefix_cache": self.prefix_cache, "kv": self.kv or 0}
        if self.adapters:
            parts["adapters"] = self.adapters
        return parts


@attrs.frozen
class MemoryPlan:
    """The memory settings a model's reservation and served context follow."""

    max_loaded: int
    budget: int | None
    """What the loaded models may reserve together (None: unknown, no bound)."""
    kv_cache_bytes: int | None
    prompt_cache_bytes: int | None
    """None: `default_prefix_cache` of the model's share."""
    max_concurrency: int
    kv_bits: int | None = None
    kv_group_size: int = 64

    def reservation(self, name: str, facts: ModelFacts) -> Reservation:
        """What `facts`' model will reserve. Raises 503 `insufficient_memory` when it
        cannot fit its share of the budget, or the budget at all."""
        budget = self.budget
        share = None if budget is None else budget // self.max_loaded
        kv = self.kv_cache_bytes
        prefix = self.prompt_cache_bytes
        if prefix is None:  # beside an explicit KV budget, a quarter of what it leaves
            room = share if share is None or kv is None else share - kv
            prefix = default_prefix_cache(room, facts.weight_bytes)
        if facts.kind in (
            "embedding",
            "reranker",
            "stt",
            "tts",
        ):  # no KV budget, no prefix cache: its weights,
            # and a forward's activations (a Whisper's decoder KV lasts one 30-second window)
            # which the batch bounds keep transient and small
            prefix, kv = 0, 0
        if kv is None and share is not None:
            kv = share - facts.weight_bytes - prefix
            if kv <= 0:
                raise insufficient(
                    f"the model {name!r} does not fit its share of the memory budget "
                    f"({share} bytes: --memory-budget over --max-loaded-models) with its "
                    f"weights ({facts.weight_bytes} bytes) and prefix cache ({prefix} bytes)"
                )
        reservation = Reservation(facts.weight_bytes, prefix, kv)
        if budget is not None and reservation.total > budget:
            raise insufficient(
                f"the model {name!r} needs {reservation.total} bytes (weights, KV and prefix "
                f"cache), more than the memory budget of {budget} bytes"
            )
        return reservation

    def served_context(self, facts: ModelFacts, reservation: Reservation) -> int | None:
        """The context the model will serve once loaded, as its engine will cap it by the
        KV budget of `reservation`: the model's own where nothing caps it. None where the
        model's own context or KV cost is unknown before the load."""
        context, layout = facts.context_length, facts.kv_layout
        if context is None or facts.kind not in ("lm", "vlm"):
            return context
        if reservation.kv is None:
            return None  # the engine derives its KV budget from the device at load time
        if layout is None:
            return None
        per_token = layout.bytes_per_token(self.kv_bits, self.kv_group_size)
        budget = kv_budget(reservation.kv, per_token, context, self.max_concurrency)
        return budget.served_context(context)


def held(reservation: Reservation, model: ModelInfo, *, prefix_cache: bool) -> Reservation:
    """What a loaded text model really reserves: its KV budget as its engine took it (no
    more than its sequences can use; none for a model without a growing KV cache), its
    prefix cache's budget where it has one."""
    kv = reservation.kv
    if model.kv_budget_tokens is not None:
        kv = model.kv_budget_tokens * model.kv_bytes_per_token
    elif model.kv_bytes_per_token == 0:
        kv = 0
    return attrs.evolve(
        reservation, kv=kv, prefix_cache=reservation.prefix_cache if prefix_cache else 0
    )


def insufficient(message: str) -> Overloaded:
    return Overloaded(message, param="model", code="insufficient_memory")
