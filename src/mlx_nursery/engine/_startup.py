"""The text engine thread's start: from its config to a `Runner` ready to serve.

In order: MLX's CUDA switches (read at their first use, so set before the load), the model
(or, distributed, this rank's shard) with its draft model and LoRA adapters, the ragged
decode-attention kernel, the prefix cache and its disk tier, the KV budget (measured right
after loading, while MLX's active memory is the weights), the warm-up (before ready:
decisions/0016, 0034), and what Trio is told of the model (`ModelInfo`). The scripted model
has no weights: no KV to measure, no kernels to warm, no prefix to cache (`_scripted.py`).

Engine thread only; the loop that serves afterwards is `Worker`'s (`_worker.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import attrs
import mlx.core as mx

from ..models import LoadedModel, load_model
from ._adapters import adapter_bytes, with_adapters
from ._backend import on_cuda, prepare_backend
from ._config import EngineConfig
from ._decode_attention import install as install_attention
from ._decode_prelude import install as install_prelude
from ._detokenizer import TokenTexts
from ._disk_kv import DiskKV, open_disk_kv
from ._draft_model import with_draft_model
from ._fused_norm import install as install_fused_norm
from ._kv_quant import CacheFactory, cache_factory, check_quantizable
from ._ledger import Ledger
from ._memory import (
    MIN_KV_TOKENS,
    KVBudget,
    derive_kv_bytes,
    device_memory,
    kv_budget,
    kv_bytes_per_token,
)
from ._messages import ModelInfo
from ._outbox import Outbox
from ._prefix_cache import PrefixCache
from ._runner import Runner
from ._types import Tokenizer
from ._vision import vision_processor
from ._warmup import WARMUP_PATIENCE_S, WarmupPlan, plan_for, warm_up

log = logging.getLogger("mlx_nursery.engine")


@attrs.frozen(eq=False)
class Ready:
    """What the engine thread serves with once started."""

    runner: Runner
    """It holds the model from here on, until the worker releases its memory."""
    cache: PrefixCache | None
    """The prefix cache (None: off, or the scripted model)."""
    info: ModelInfo
    """What Trio is told of the model."""


def start_up(
    config: EngineConfig, outbox: Outbox, ledger: Ledger, wake: Callable[[], None]
) -> Ready:
    """Load the model and build everything serving it needs; `wake` is told (from the disk
    tier's reader thread) when a read from disk is over.

    Raises what any step raised, with the disk tier it opened closed. Blocks for the whole
    load and warm-up; nothing interrupts it (the Trio side waits for its report)."""
    disk: DiskKV | None = None
    try:
        prepare_backend(cudnn_attention=config.cudnn_attention, cuda_graphs=config.cuda_graphs)
        distribution = config.distribution
        model = (
            load_model(config.model, fuse_weights=config.fuse_weights)
            if distribution is None
            else distribution.load(config)
        )
        model = with_adapters(with_draft_model(model, config), config)
        if model.kind == "lm" and install_attention(
            model.model, ragged=config.ragged_attention, sequences=not config.cudnn_attention
        ):
            preludes = install_prelude(model.model)
            fused_norms = install_fused_norm(model.model)
            log.info(
                "attention routed (CUDA): ragged decode kernel %s, sequence attention %s,"
                " one-kernel decode prelude in %d blocks, fused add and norm in %d",
                "on" if config.ragged_attention else "off",
                "off" if config.cudnn_attention else "on",
                preludes,
                fused_norms,
            )
        scripted = model.kind == "scripted"
        cache = None
        if config.prompt_cache_bytes > 0 and not scripted:
            cache = PrefixCache(
                max_bytes=config.prompt_cache_bytes,
                max_entries=config.prompt_cache_entries,
                ttl=config.prompt_cache_ttl,
            )
        quantization = config.kv_quantization
        if quantization is not None and not scripted:
            check_quantizable(model.model, quantization)
        make_cache = cache_factory(quantization)
        if not scripted:  # its directory's scan runs beside the warm-up
            disk = open_disk_kv(config, model, make_cache, wake)
        budget, per_token = (
            (KVBudget(None), 0)
            if scripted
            else _kv_budget(config, model.model, make_cache, model.context_length, model.draft)
        )
        if config.warmup and not scripted:
            seconds = _warm_up(config, model, make_cache, quantization is not None)
            log.info("warm-up done in %.1f s", seconds)
        if disk is not None:
            disk.tier.wait_ready()  # its files indexed: a restart serves them
        runner = Runner(config, model, cache, outbox, ledger, budget, disk)
        return Ready(runner, cache, _model_info(model, budget, per_token))
    except BaseException:
        if disk is not None:
            disk.close()
        raise


def _model_info(model: LoadedModel, budget: KVBudget, per_token: int) -> ModelInfo:
    return ModelInfo(
        path=str(model.path),
        # A text model's is mlx-lm's wrapper, which mypy sees as Any (it skips mlx-lm).
        tokenizer=cast(Tokenizer, model.tokenizer),
        context_length=budget.served_context(model.context_length),
        kv_budget_tokens=budget.tokens,
        kv_bytes_per_token=per_token,
        vision=vision_processor(model),
        eos_token_ids=frozenset(int(t) for t in model.tokenizer.eos_token_ids),
        texts=TokenTexts(model.tokenizer),
        vocab_size=model.vocab_size,
        scripted=model.kind == "scripted",
        adapters=adapter_bytes(model),
        serves_adapters=model.adapters is not None,
    )


def _warm_up(
    config: EngineConfig, model: LoadedModel, make_cache: CacheFactory, kv_quantized: bool
) -> float:
    """The warm-up; distributed, on the engine's own mirrored batch stepper, every rank
    compiling as rank 0 does (each first step may take long: every rank waits)."""
    plan = _warmup_plan(config)
    distribution = config.distribution
    if distribution is None:
        return warm_up(model, plan, make_cache, kv_quantized=kv_quantized)
    mirrored_cache = make_cache if kv_quantized else None
    with distribution.patient(WARMUP_PATIENCE_S + plan.budget_s):
        return warm_up(
            model,
            plan,
            make_cache,
            kv_quantized=kv_quantized,
            make_batch=lambda: distribution.batch_stepper(model.model, config, mirrored_cache),
        )


def _warmup_plan(config: EngineConfig) -> WarmupPlan:
    return plan_for(
        gpu=mx.default_device().type == mx.DeviceType.gpu,
        max_concurrency=config.max_concurrency,
        prefill_step_size=config.chunk_tokens(),
        prefill_batch_size=config.prefill_batch_size,
        fast_path=config.single_sequence_fast_path,
        budget_s=config.warmup_budget_s,
        speculation=config.speculation,
        pack_chunks=config.packs_chunks,
        split_keys=config.ragged_attention and on_cuda(),
    )


def _kv_budget(
    config: EngineConfig, model: Any, make_cache: CacheFactory, context: int, draft: Any = None
) -> tuple[KVBudget, int]:
    """The KV budget in tokens, from `kv_cache_bytes` or the device's memory (right after
    loading, when MLX's active memory is the weights), at what a token costs in the
    caches the engine makes (quantized ones cost less: more tokens fit); and that cost.
    With a draft model, each running token holds the draft's KV too: the tokens are
    counted at both costs, the cost returned is the served model's (what a cached prefix
    holds)."""
    per_token = kv_bytes_per_token(model, make_cache)
    draft_per_token = 0 if draft is None else kv_bytes_per_token(draft)
    kv_bytes = config.kv_cache_bytes
    if kv_bytes is None:
        kv_bytes = derive_kv_bytes(
            device_memory(mx.device_info()),
            mx.get_active_memory(),
            config.prompt_cache_bytes,
        )
    if config.distribution is not None:  # every rank must hold the batch's KV
        kv_bytes = config.distribution.agree_kv_bytes(kv_bytes, per_token)
    if kv_bytes is None or per_token == 0:
        return KVBudget(None), per_token
    if kv_bytes // per_token < MIN_KV_TOKENS:
        log.warning(
            "KV memory for %d tokens only; serving %d anyway (set --kv-cache-bytes)",
            kv_bytes // per_token,
            MIN_KV_TOKENS,
        )
    if draft_per_token:
        kv_bytes = kv_bytes * per_token // (per_token + draft_per_token)
    budget = kv_budget(kv_bytes, per_token, context, config.max_concurrency)
    log.info(
        "KV budget: %d tokens (%d bytes per token%s)",
        budget.tokens,
        per_token,
        f", and {draft_per_token} of the draft model's" if draft_per_token else "",
    )
    return budget, per_token
