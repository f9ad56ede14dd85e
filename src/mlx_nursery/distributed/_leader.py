"""Rank 0's side: the engine's `Distribution` (engine/_distribution.py).

The engine on rank 0 decides everything as on one device; its batch stepper is a
`MirroredStepper`, which records each insert and removal and, before each step, sends the
record to the other ranks (`_channel`), so that every rank runs the same step on the same
batch. Rank 0 alone samples (samplers, logits processors, grammars, penalties, logit
bias); its tokens reach the others inside the step's graph (`share_tokens`), so the
followers need none of that, and stop strings, logprobs and cancellations, decided here,
reach them as removals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import attrs
import mlx.core as mx

from ..engine import EngineConfig
from ..engine.stepping import (
    BatchStepper,
    CacheFactory,
    KVState,
    LiveSequence,
    Response,
    Sampler,
    Start,
    Stepper,
    sample_batch,
)
from ..models import LoadedModel, resolve_model_path
from ._channel import Channel
from ._loading import Mode, load_shard, meet_on_the_model
from ._ops import Hello, Op, agreed_kv_bytes, kv_offer, share_tokens
from ._watchdog import Watchdog

log = logging.getLogger("mlx_nursery.distributed")

HEARTBEAT_SECONDS = 1.0
"""While idle, rank 0 sends an empty record this often (followers' watchdogs wait for it)."""


def peer_ranks(group: mx.distributed.Group) -> str:
    """The ranks a failed collective implicates (rank 0 cannot tell which one of several)."""
    peers = group.size() - 1
    return "distributed group: " + ("rank 1" if peers == 1 else f"one of ranks 1-{peers}")


def stall_detail(group: mx.distributed.Group, timeout: float, what: str) -> str:
    return f"{peer_ranks(group)} did not join {what} within {timeout:g} s"


class Leader:
    """Rank 0's `Distribution`: one per process (one group)."""

    def __init__(self, mode: Mode, group: mx.distributed.Group, timeout: float) -> None:
        self.mode = mode
        self.group = group
        self.watchdog = Watchdog(
            timeout, lambda what, bound: stall_detail(group, bound, what), on_stall=self._stalled
        )
        self.failure: str | None = None
        self.report: Callable[[str], None] | None = None
        """Told a stall before the process exits (the server: /health, in-flight requests)."""
        self._channel = Channel(group, self.watchdog)
        self._pending: list[Op] = []
        self._last_sent = time.monotonic()
        self.closed = False

    def _stalled(self, detail: str) -> None:
        self.failure = detail
        if self.report is not None:
            self.report(detail)

    def load(self, config: EngineConfig) -> LoadedModel:
        path = resolve_model_path(config.model)
        model = load_shard(path, self.mode, self.group)
        meet_on_the_model(self._channel, path)
        self._channel.send(attrs.asdict(Hello.of(config)))
        log.info("serving across %d ranks (%s parallel)", self.group.size(), self.mode)
        return model

    def agree_kv_bytes(self, kv_bytes: int | None, per_token: int) -> int | None:
        return agreed_kv_bytes(self._channel.gather(kv_offer(kv_bytes, per_token), "the KV budget"))

    def batch_stepper(
        self, model: Any, config: EngineConfig, make_cache: CacheFactory | None
    ) -> Stepper:
        inner = BatchStepper(
            model,
            max_concurrency=config.max_concurrency,
            prefill_batch_size=config.prefill_batch_size,
            prefill_step_size=config.chunk_tokens(),
            chunk_sizer=None,  # its sizes follow measured times: no two ranks would agree
            make_cache=make_cache,
            draw=self._draw,
            # The ranks' forwards must be the same model call: pipeline ranks pass hidden
            # states inside the model's own `__call__` (the body alone is not split alike).
            fold_first_tokens=False,
        )
        return MirroredStepper(inner, self)

    def _draw(self, samplers: Sequence[Sampler], logprobs: mx.array) -> mx.array:
        return share_tokens(sample_batch(samplers, logprobs), self.group)

    def record(self, op: Op) -> None:
        self._pending.append(op)

    def send(self, *, step: bool) -> None:
        """Send what was recorded (and `step`): every rank applies it before its step.
        Before a step the record is posted (not waited for: the step's own wait follows);
        otherwise (heartbeats, shutdown) every rank has it when this returns."""
        ops, self._pending = self._pending, []
        if step:
            ops.append(["step"])
        try:
            if step:
                self._channel.post(ops)
            else:
                self._channel.send(ops)
        except Exception as exc:
            self.failure = f"{peer_ranks(self.group)} failed: a broadcast failed ({exc})"
            raise
        self._last_sent = time.monotonic()

    @contextmanager
    def patient(self, seconds: float) -> Iterator[None]:
        """Every rank waits up to `seconds` for the others in the block (the warm-up, whose
        first steps compile kernels), then the usual bound again."""
        usual = self.watchdog.timeout
        self.record(["patience", seconds, True])
        self.watchdog.timeout = seconds
        try:
            yield
        finally:
            self.watchdog.timeout = usual
            self.record(["patience", usual, False])

    def watching(self, what: str) -> Any:
        return self.watchdog.watching(what)

    def tick(self) -> None:
        if time.monotonic() - self._last_sent >= HEARTBEAT_SECONDS:
            self.send(step=False)  # removals recorded since the last step go with it

    def close(self, *, failed: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if self.failure is not None:  # a peer is gone: nobody to tell
            self.watchdog.stop()
            return
        self.record(["shutdown", failed])
        try:
            self.send(step=False)
        finally:
            self.watchdog.stop()


class MirroredStepper:
    """A `BatchStepper` whose operations the other ranks apply in the same order."""

    kind: Literal["solo", "batch"] = "batch"

    def __init__(self, inner: BatchStepper, leader: Leader) -> None:
        self._inner = inner
        self._leader = leader

    def insert(self, sequence: LiveSequence, start: Start) -> int:
        if start.cache is not None:  # the prefix cache is off when distributed
            raise RuntimeError("a cached prefix cannot be mirrored to the other ranks")
        uid = self._inner.insert(sequence, start)
        self._leader.record(
            [
                "insert",
                uid,
                start.prompt,
                start.cache_tokens,
                start.max_tokens,
                sorted(sequence.stop_ids),
            ]
        )
        return uid

    def step(self) -> list[Response]:
        self._leader.send(step=True)
        with self._leader.watching("a step"):
            return self._inner.step()

    def remove(self, uids: list[int], *, keep_state: bool) -> dict[int, KVState]:
        self._inner.remove(uids, keep_state=False)
        self._leader.record(["remove", uids])
        return {}

    def close(self) -> None:
        self._inner.close()
        self._leader.record(["reset"])

    @property
    def uids(self) -> frozenset[int]:
        return self._inner.uids

    @property
    def prefilled(self) -> int:
        return self._inner.prefilled

    @property
    def token_in_flight(self) -> bool:
        return False

    @property
    def drafting(self) -> frozenset[int]:
        return self._inner.drafting  # none: the batch drafts nothing across devices
