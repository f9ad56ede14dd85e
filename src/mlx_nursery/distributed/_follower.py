"""Ranks > 0: a headless follower (no HTTP, no Trio) that loads its shard and runs, in
order, every batch operation rank 0 sends (`_ops`), until rank 0 says shut down.

It starts as rank 0's engine thread does, collective for collective: the model check, the
hello, the KV-quantization probe (with --kv-bits), the KV cost probe, the KV budget; then
applies records. Its samplers draw nothing: rank 0's tokens arrive inside each step.
On exit it prints one line, `mlx-nursery follower <rank>: {counters as JSON}`.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx

from ..engine.stepping import (
    BatchStepper,
    KVQuantization,
    Sampler,
    Start,
    cache_factory,
    check_quantizable,
    derive_kv_bytes,
    device_memory,
    install_attention,
    kv_bytes_per_token,
    prepare_backend,
)
from ..models import ModelLoadError
from ._channel import Channel
from ._loading import Mode, load_shard, meet_on_the_model
from ._ops import Hello, Op, kv_offer, shared_tokens
from ._watchdog import Watchdog

log = logging.getLogger("mlx_nursery.distributed")


@attrs.define
class FollowerCounters:
    """What a follower did, printed on exit (tests and operators compare it with rank 0)."""

    rank: int
    steps: int = 0
    tokens: int = 0
    """Tokens its steps returned (one per decoding sequence per step)."""
    inserted: int = 0
    finished: int = 0
    """Sequences its batch ended itself (a stop token, max tokens)."""
    removed: dict[str, int] = attrs.Factory(dict)
    """Sequences removed while running (cancelled, stopped on text): uid -> their tokens."""
    resets: int = 0
    active: int = 0


class Follower:
    def __init__(self, model: Any, hello: Hello, group: mx.distributed.Group) -> None:
        self._model = model
        self._hello = hello
        self._group = group
        quantization = (
            None if hello.kv_bits is None else KVQuantization(hello.kv_bits, hello.kv_group_size)
        )
        self.make_cache = cache_factory(quantization)
        self.counters = FollowerCounters(group.rank())
        self._tokens: dict[int, int] = {}
        self._batch = self._new_batch()

    def _new_batch(self) -> BatchStepper:
        return BatchStepper(
            self._model,
            max_concurrency=self._hello.max_concurrency,
            prefill_batch_size=self._hello.prefill_batch_size,
            prefill_step_size=self._hello.prefill_step_size,
            chunk_sizer=None,
            make_cache=self.make_cache if self._hello.kv_bits is not None else None,
            draw=self._draw,
            # The ranks' forwards must be the same model call: pipeline ranks pass hidden
            # states inside the model's own `__call__` (the body alone is not split alike).
            fold_first_tokens=False,
        )

    def _draw(self, samplers: Sequence[Sampler], logprobs: mx.array) -> mx.array:
        return shared_tokens(logprobs.shape[0], self._group)

    def apply(self, op: Op, watchdog: Watchdog) -> bool | None:
        """Apply one operation; at `shutdown`, return whether rank 0 failed."""
        name = op[0]
        counters = self.counters
        if name == "insert":
            _, uid, prompt, cache_tokens, max_tokens, stop_ids = op
            got = self._batch.insert_row(
                Start(prompt, None, cache_tokens, max_tokens),
                sampler=_no_sampler,
                processors=[],
                stop_ids=frozenset(stop_ids),
            )
            if got != uid:
                raise RuntimeError(f"out of step with rank 0: uid {got}, rank 0's {uid}")
            self._tokens[uid] = 0
            counters.inserted += 1
        elif name == "remove":
            running = [uid for uid in op[1] if uid in self._tokens]
            for uid in running:
                counters.removed[str(uid)] = self._tokens.pop(uid)
            self._batch.remove(op[1], keep_state=False)
        elif name == "reset":
            self._batch.close()
            self._batch = self._new_batch()
            self._tokens.clear()
            counters.resets += 1
        elif name == "step":
            with watchdog.watching("a step"):
                responses = self._batch.step()
            counters.steps += 1
            for response in responses:
                if response.uid in self._tokens:
                    self._tokens[response.uid] += 1
                    counters.tokens += 1
                    if response.finish_reason is not None:
                        del self._tokens[response.uid]
                        counters.finished += 1
        elif name == "patience":  # the warm-up's first compiles, then the usual bound
            _, seconds, warming = op
            watchdog.timeout = float(seconds)
            if not warming:  # what the warm-up ran is no request's: not counted
                self.counters = FollowerCounters(self.counters.rank)
                counters = self.counters
        elif name == "shutdown":
            return bool(op[1])
        else:
            raise RuntimeError(f"unknown operation from rank 0: {name!r}")
        counters.active = len(self._tokens)
        return None

    def close(self) -> None:
        self._batch.close()


def _no_sampler(logprobs: mx.array) -> mx.array:
    raise AssertionError("a follower draws nothing: rank 0's tokens arrive in the step")


@attrs.frozen
class Backend:
    """How rank 0's engine runs MLX (`EngineConfig`'s switches, from the same command line
    on every rank): a follower runs its shard with the same kernels, or the group steps at
    the pace of the slowest path."""

    cudnn_attention: bool = False
    cuda_graphs: bool = False
    ragged_attention: bool = True

    def prepare(self) -> None:
        """MLX's backend set as rank 0's engine sets it (`prepare_backend`): before the
        group forms, as MLX reads the switches once, at its first work on the GPU."""
        prepare_backend(cudnn_attention=self.cudnn_attention, cuda_graphs=self.cuda_graphs)


def run_follower(path: Path, mode: Mode, timeout: float, backend: Backend = Backend()) -> int:
    """Serve as a follower until rank 0 shuts the group down; return the exit status
    (0, or 1 if rank 0's engine failed; 2 if the model was refused; a stall exits 3).
    `backend.prepare()` must have run before anything ran on the GPU (`start_rank`)."""
    group = mx.distributed.init()
    rank = group.rank()
    watchdog = Watchdog(timeout, lambda what, bound: stall_detail_follower(rank, bound, what))
    channel = Channel(group, watchdog)
    try:
        model = load_shard(path, mode, group)
        install_attention(
            model.model, ragged=backend.ragged_attention, sequences=not backend.cudnn_attention
        )
        meet_on_the_model(channel, path)
    except ModelLoadError as exc:
        log.error("rank %d: %s", rank, exc)
        return 2
    hello = Hello(**channel.receive())
    follower = Follower(model.model, hello, group)
    if hello.kv_bits is not None:
        check_quantizable(model.model, KVQuantization(hello.kv_bits, hello.kv_group_size))
    per_token = kv_bytes_per_token(model.model, follower.make_cache)  # its own layers' KV
    kv_bytes = hello.kv_cache_bytes
    if kv_bytes is None:
        kv_bytes = derive_kv_bytes(device_memory(mx.device_info()), mx.get_active_memory(), 0)
    channel.gather(kv_offer(kv_bytes, per_token), "the KV budget")
    log.info(
        "rank %d: following rank 0 (%s parallel; %d bytes of KV a token)", rank, mode, per_token
    )
    failed: bool | None = None
    try:
        while failed is None:
            for op in channel.receive():
                failed = follower.apply(op, watchdog)
    finally:
        follower.close()
        watchdog.stop()
        print(f"mlx-nursery follower {rank}: {json.dumps(attrs.asdict(follower.counters))}")
        sys.stdout.flush()
    return 1 if failed else 0


def stall_detail_follower(rank: int, timeout: float, what: str) -> str:
    return f"rank {rank}: rank 0 did not send {what} within {timeout:g} s"
