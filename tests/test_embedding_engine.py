"""The embedding engine on a real tiny BERT: requests batched into shared forwards within
their bounds, and a cancelled request out of the engine, its lane back, within a forward."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np
import pytest
import trio
from transformers import AutoTokenizer

from mlx_nursery.engine import (
    EMBEDDING_THREAD_NAME,
    Embedder,
    EmbedderConfig,
    EmbeddingRequest,
    EngineOverloaded,
    EngineUnavailable,
)
from mlx_nursery.engine._embedding_worker import BatchLimits, EmbeddingWorker, Ended

from .http_helpers import eventually

TEXTS = ["hello world", "the model is a server", "what", "please answer the question"]


def token_ids(model: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    return [tokenizer.encode(text) for text in TEXTS]


def run_worker(
    model: Path, limits: BatchLimits, submits: list[list[list[int]]], forwards: int
) -> list[Ended]:
    """Submit every request before the thread starts, so its first iteration finds them all
    (requests that arrived together); return what ended, once all have, after checking that
    it took `forwards` forwards."""
    ended: queue.Queue[list[Ended]] = queue.Queue()
    worker = EmbeddingWorker(
        str(model), limits, lambda items, _: ended.put(items), lambda *_: None, lambda _: None
    )
    for request_id, inputs in enumerate(submits):
        worker.submit(request_id, inputs, None)
    thread = threading.Thread(target=worker.run, name=EMBEDDING_THREAD_NAME)
    thread.start()
    done: list[Ended] = []
    try:
        while len(done) < len(submits):
            done.extend(ended.get(timeout=60))
    finally:
        worker.stop()
        thread.join()
    assert worker.forwards == forwards
    return sorted(done, key=lambda e: e.request_id)


def test_requests_there_together_share_one_forward_within_the_bounds(
    tiny_embedding: Path,
) -> None:
    ids = token_ids(tiny_embedding)
    alone = [run_worker(tiny_embedding, BatchLimits(1, 1), [[i]], 1)[0].vectors for i in ids]
    together = run_worker(tiny_embedding, BatchLimits(32, 8192), [[i] for i in ids], 1)
    for single, ended in zip(alone, together, strict=True):
        assert single is not None and ended.vectors is not None
        np.testing.assert_allclose(ended.vectors[0], single[0], atol=1e-5)
    # bounded: 3 inputs a forward; then by padded tokens (the longest times the inputs)
    run_worker(tiny_embedding, BatchLimits(3, 8192), [[i] * 2 for i in ids], 3)  # 8 inputs
    longest = max(len(i) for i in ids)
    run_worker(tiny_embedding, BatchLimits(32, 2 * longest), [ids, ids], 4)  # 2 a forward
    ended = run_worker(tiny_embedding, BatchLimits(32, 16), [[[7] * 100], [[7]]], 2)
    assert [len(e.vectors or []) for e in ended] == [1, 1]  # past the budget: alone


async def test_a_cancelled_request_leaves_within_a_forward_and_its_lane_comes_back(
    tiny_embedding: Path,
) -> None:
    config = EmbedderConfig(tiny_embedding, max_concurrency=1, max_queue=1, max_batch_inputs=1)
    long = EmbeddingRequest([[7] * 100] * 2000)  # 2000 forwards of one input
    async with trio.open_nursery() as nursery:
        embedder: Embedder = await nursery.start(Embedder(config).run)
        first = trio.CancelScope()
        waiter = trio.CancelScope()

        async def run_long() -> None:
            with first:
                await embedder.embed(long)

        async def run_waiting() -> None:
            with waiter:
                await embedder.embed(EmbeddingRequest([[7]]))

        nursery.start_soon(run_long)
        await eventually(lambda: embedder.forwards >= 1, "the long request computes")
        nursery.start_soon(run_waiting)
        await eventually(lambda: embedder.statistics().queued == 1, "the second one queues")
        with pytest.raises(EngineOverloaded):  # the queue (1) is full: refused at once
            await embedder.embed(EmbeddingRequest([[7]]))
        waiter.cancel()  # cancelled while queued: no compute, nothing to confirm
        await eventually(lambda: embedder.statistics().queued == 0, "the waiter leaves")
        first.cancel()
        await eventually(lambda: embedder.statistics().lanes_borrowed == 0, "the lane is back")
        stats = embedder.statistics()
        assert stats.cancellations.confirmed == 1
        # confirmed at most one forward after the cancel was asked for
        assert sum(stats.cancellations.steps_in_flight[2:]) == 0
        assert embedder.forwards < 2000
        after = await embedder.embed(EmbeddingRequest([[7], [8]]))  # it serves on
        assert [v.shape for v in after] == [(64,), (64,)]
        embedder.close()
    with pytest.raises(EngineUnavailable):
        await embedder.embed(EmbeddingRequest([[7]]))
    assert EMBEDDING_THREAD_NAME not in {t.name for t in threading.enumerate()}
