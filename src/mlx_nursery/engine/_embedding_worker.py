"""The embedding engine's thread: it loads the model and makes every MLX call of it.

The model is an embedding model (each input gives its pooled vector) or a cross-encoder (each
input, a query and a document framed together, gives its head's logits: a row of one).

The loop, each iteration: take the commands that arrived (blocking only while nothing is
pending); a submission joins the pending requests, a cancel removes a request (whatever of
it is still pending) and confirms it at once, a stop ends them all. Then one forward: the
pending inputs in arrival order, as many as fit the batch's bounds (inputs, and padded
tokens: inputs times the longest), right-padded with an attention mask; every request whose
last input was in it ends. Then one post to the Trio thread with what ended.

So a cancel is honoured before the next forward: a request cancelled while its inputs are
in the running forward is confirmed as that forward ends (its vectors are dropped), one
cancelled while waiting costs no compute. A forward that fails is run again one request
at a time: the request it fails on fails, the others go on, and so does the engine.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np

from .. import fault_points
from ..fault_points import request_label
from ..models import EmbeddingSpec, LoadedModel, PoolingMode, load_model
from ._device_thread import run_device_thread

log = logging.getLogger("mlx_nursery.engine")


@attrs.frozen
class BatchLimits:
    max_inputs: int
    """Inputs in one forward."""
    max_tokens: int
    """Padded tokens in one forward (inputs times the longest); one longer input runs alone."""


@attrs.frozen
class Submit:
    request_id: int
    inputs: list[list[int]]
    dimensions: int | None
    token_types: list[list[int]] | None = None
    """Each input's token types (a cross-encoder's pairs); None: all 0."""
    label: str | None = None
    """The request's label (its HTTP request id), for the fault seam (`fault_points`)."""


@attrs.frozen
class Cancel:
    request_id: int


@attrs.frozen
class Stop:
    pass


Command = Submit | Cancel | Stop


@attrs.frozen
class Ended:
    """A request that left the engine: its vectors (a cross-encoder's: each input's logits),
    or its failure, or neither (cancelled)."""

    request_id: int
    vectors: list[np.ndarray] | None = None
    failed: bool = False


@attrs.frozen
class EmbeddingModelInfo:
    path: str
    tokenizer: Any
    spec: EmbeddingSpec


@attrs.define(eq=False)
class _Pending:
    submit: Submit
    vectors: list[np.ndarray | None]
    next: int = 0
    """The first input not yet in a forward."""
    running: int = 0
    """Its inputs in the current forward."""


class EmbeddingWorker:
    """Runs on its own thread (`run`); the other methods are called from the Trio thread."""

    def __init__(
        self,
        model: str | Path,
        limits: BatchLimits,
        post: Callable[[list[Ended], int], None],
        on_ready: Callable[[EmbeddingModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        self._model_spec = model
        self._limits = limits
        self._post = post
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._pending: dict[int, _Pending] = {}
        self.forwards = 0
        """Forwards run (read from the Trio thread: an int, written by this thread only)."""

    # -- from the Trio thread -----------------------------------------------------------------
    def submit(
        self,
        request_id: int,
        inputs: list[list[int]],
        dimensions: int | None,
        token_types: list[list[int]] | None = None,
    ) -> None:
        self._commands.put(Submit(request_id, inputs, dimensions, token_types, request_label.get()))

    def cancel(self, request_id: int) -> None:
        self._commands.put(Cancel(request_id))

    def stop(self) -> None:
        self._commands.put(Stop())

    # -- the thread ---------------------------------------------------------------------------
    def run(self) -> None:
        run_device_thread(
            "embedding engine", self._load, self._loop, self._finish, self._on_ready, self._on_exit
        )

    def _load(self) -> tuple[EmbeddingModelInfo, LoadedModel]:
        loaded = load_model(self._model_spec)
        if loaded.kind not in ("embedding", "reranker") or loaded.embedding is None:
            raise ValueError(f"{loaded.path} is neither an embedding model nor a cross-encoder")
        return EmbeddingModelInfo(str(loaded.path), loaded.tokenizer, loaded.embedding), loaded

    def _finish(self, exc: BaseException | None) -> None:
        """Whatever is pending ends unserved (the thread is stopping, or died)."""
        self._post([Ended(rid) for rid in self._pending], self.forwards)
        self._pending.clear()

    def _loop(self, loaded: LoadedModel) -> None:
        while True:
            ended: list[Ended] = []
            for command in self._take_commands():
                if isinstance(command, Stop):
                    self._post(ended, self.forwards)  # the rest end as the thread does
                    return
                if isinstance(command, Submit):
                    count = len(command.inputs)
                    self._pending[command.request_id] = _Pending(command, [None] * count)
                elif self._pending.pop(command.request_id, None) is not None:
                    ended.append(Ended(command.request_id))
            if ended:  # confirmed before the forward: their lanes are free while it runs
                self._post(ended, self.forwards)
            if self._pending:
                self._post(self._forward(loaded), self.forwards)

    def _take_commands(self) -> list[Command]:
        commands: list[Command] = []
        if not self._pending:
            commands.append(self._commands.get())
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _forward(self, loaded: LoadedModel) -> list[Ended]:
        batch = self._take_batch()
        spec = loaded.embedding
        assert spec is not None
        rows = self._pooled(loaded.model, batch, spec)
        ended: list[Ended] = []
        for (pending, _), row in zip(batch, rows, strict=True):
            request_id = pending.submit.request_id
            if row is None:
                if self._pending.pop(request_id, None) is not None:
                    ended.append(Ended(request_id, failed=True))
                continue
            index = pending.next - pending.running
            pending.vectors[index] = finish_vector(row, pending.submit.dimensions, spec.normalize)
            pending.running -= 1
        for request_id, pending in list(self._pending.items()):
            if pending.next == len(pending.vectors) and pending.running == 0:
                del self._pending[request_id]
                vectors = [v for v in pending.vectors if v is not None]
                ended.append(Ended(request_id, vectors))
        return ended

    def _pooled(
        self, model: Any, batch: list[tuple[_Pending, int]], spec: EmbeddingSpec
    ) -> list[np.ndarray | None]:
        """The batch's pooled rows. A forward that fails is run again one request at a
        time, so that only the request it fails on fails (None: its rows)."""
        groups: dict[int, list[int]] = {}
        for position, (pending, _) in enumerate(batch):
            groups.setdefault(pending.submit.request_id, []).append(position)
        rows: list[np.ndarray | None] = [None] * len(batch)
        attempts = [list(range(len(batch)))]
        while attempts:
            positions = attempts.pop()
            self.forwards += 1
            try:
                if fault_points.ARMED:  # a test's fault in the forward holding this request
                    for position in positions:
                        fault_points.reach("embedding_forward", batch[position][0].submit.label)
                pooled = embed_batch(model, [batch[p] for p in positions], spec)
            except Exception:
                if len(positions) < len(batch) or len(groups) == 1:
                    log.exception("an embedding forward failed; its request fails")
                    continue
                log.warning("an embedding forward failed; its requests are run one at a time")
                attempts.extend(groups.values())
                continue
            for position, row in zip(positions, pooled, strict=True):
                rows[position] = row
        return rows

    def _take_batch(self) -> list[tuple[_Pending, int]]:
        """The pending inputs (each its request's and its index there) in arrival order,
        within the bounds (at least one input)."""
        batch: list[tuple[_Pending, int]] = []
        longest = 0
        for pending in self._pending.values():
            inputs = pending.submit.inputs
            while pending.next < len(inputs):
                ids = inputs[pending.next]
                wider = max(longest, len(ids))
                if batch and (
                    len(batch) == self._limits.max_inputs
                    or wider * (len(batch) + 1) > self._limits.max_tokens
                ):
                    return batch
                batch.append((pending, pending.next))
                longest = wider
                pending.next += 1
                pending.running += 1
        return batch


def embed_batch(model: Any, inputs: list[tuple[_Pending, int]], spec: EmbeddingSpec) -> np.ndarray:
    """One forward of `inputs` (right-padded, masked): their pooled vectors, or a
    cross-encoder's logits, float32, in order. MLX calls: the engine thread only."""
    rows = [pending.submit.inputs[index] for pending, index in inputs]
    longest = max(len(ids) for ids in rows)
    padded = [ids + [spec.pad_token_id] * (longest - len(ids)) for ids in rows]
    lengths = mx.array([len(ids) for ids in rows])
    mask = (mx.arange(longest)[None, :] < lengths[:, None]).astype(mx.int32)
    if spec.classifier is not None:
        types = None
        if spec.classifier.token_types:
            types = mx.array([_types(pending.submit, index, longest) for pending, index in inputs])
        logits = model(mx.array(padded), attention_mask=mask, token_type_ids=types)
        return np.array(logits.astype(mx.float32))
    output = model(mx.array(padded), attention_mask=mask)
    pooled = pool(output.last_hidden_state, mask, lengths, spec.pooling).astype(mx.float32)
    return np.array(pooled)


def _types(submit: Submit, index: int, width: int) -> list[int]:
    """Input `index`'s token types, padded with 0 to `width`."""
    types = submit.token_types[index] if submit.token_types is not None else []
    return types + [0] * (width - len(types))


def pool(hidden: mx.array, mask: mx.array, lengths: mx.array, mode: PoolingMode) -> mx.array:
    """One vector per row of `hidden` (batch, tokens, width), from its unpadded tokens."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        return hidden[mx.arange(hidden.shape[0]), lengths - 1]
    weights = mask[..., None].astype(hidden.dtype)
    return (hidden * weights).sum(axis=1) / mx.maximum(lengths[:, None], 1).astype(hidden.dtype)


def finish_vector(row: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """`row` cut to its first `dimensions` (Matryoshka), then scaled to unit length if the
    model normalizes: cut first, so that a shortened vector is a unit vector too (vLLM's
    order; OpenAI's shortened vectors are unit vectors)."""
    vector = np.array(row[:dimensions] if dimensions else row, dtype=np.float32)
    if normalize:
        norm = float(np.linalg.norm(vector))
        vector /= max(norm, 1e-12)
    return vector
