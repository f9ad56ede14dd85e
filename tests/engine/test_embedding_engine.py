"""The embedding engine on a real tiny BERT: requests batched into shared forwards within
their bounds, and a cancelled request out of the engine, its lane back, within a forward."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import trio
from transformers import AutoTokenizer

from mlx_nursery.engine import (
    EMBEDDING_THREAD_NAME,
    Embedder,
    EmbedderConfig,
    EmbeddingFailed,
    EmbeddingRequest,
    EngineOverloaded,
    EngineUnavailable,
)
from mlx_nursery.engine._embedding_worker import (
    BatchLimits,
    EmbeddingWorker,
    Ended,
    finish_vector,
    pool,
)
from mlx_nursery.models._embedding_loading import (
    EmbeddingConfigError,
    embedding_spec,
    is_embedding_model,
)
from tests.http_helpers import eventually

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


def test_a_forward_that_fails_fails_only_the_request_it_fails_on(tiny_embedding: Path) -> None:
    ids = token_ids(tiny_embedding)
    alone = run_worker(tiny_embedding, BatchLimits(32, 8192), [ids[:2]], 1)[0].vectors
    bad: list[list[int]] = [["not a token id"]]  # type: ignore[list-item]
    # one forward of both fails; each is then run alone: the good one's vectors come back
    good, failed = run_worker(tiny_embedding, BatchLimits(32, 8192), [ids[:2], bad], 3)
    assert alone is not None and good.vectors is not None
    for got, want in zip(good.vectors, alone, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert (failed.vectors, failed.failed) == (None, True)


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
        with pytest.raises(EmbeddingFailed):
            await embedder.embed(EmbeddingRequest([["x"]]))  # type: ignore[list-item]
        assert embedder.healthy and embedder.statistics().lanes_borrowed == 0
        assert len(await embedder.embed(EmbeddingRequest([[7]]))) == 1
        embedder.close()
    with pytest.raises(EngineUnavailable):
        await embedder.embed(EmbeddingRequest([[7]]))
    assert EMBEDDING_THREAD_NAME not in {t.name for t in threading.enumerate()}


def test_pooling_reads_only_each_rows_own_tokens() -> None:
    hidden = mx.array([[[1.0, 0.0], [3.0, 2.0], [9.0, 9.0]], [[5.0, 1.0], [7.0, 3.0], [2.0, 4.0]]])
    lengths = mx.array([2, 3])  # the first row's third token is padding
    mask = (mx.arange(3)[None, :] < lengths[:, None]).astype(mx.int32)
    assert pool(hidden, mask, lengths, "cls").tolist() == [[1.0, 0.0], [5.0, 1.0]]
    assert pool(hidden, mask, lengths, "last").tolist() == [[3.0, 2.0], [2.0, 4.0]]
    mean = pool(hidden, mask, lengths, "mean").tolist()
    np.testing.assert_allclose(mean, [[2.0, 1.0], [14 / 3, 8 / 3]], rtol=1e-6)
    cut = finish_vector(np.array([3.0, 4.0, 12.0], dtype=np.float32), 2, normalize=True)
    assert cut.tolist() == pytest.approx([0.6, 0.8])  # cut first, then a unit vector
    assert finish_vector(np.array([3.0, 4.0]), None, normalize=False).tolist() == [3.0, 4.0]


def sentence_transformers_dir(tmp_path: Path, pooling: dict[str, bool], *modules: str) -> Path:
    (tmp_path / "1_Pooling").mkdir(parents=True)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    listed = [{"path": "", "type": "sentence_transformers.models.Transformer"}]
    listed += [{"path": "1_Pooling", "type": f"sentence_transformers.models.{m}"} for m in modules]
    (tmp_path / "modules.json").write_text(json.dumps(listed))
    return tmp_path


def test_the_checkpoints_sentence_transformers_files_say_how_to_pool(tmp_path: Path) -> None:
    config = {"model_type": "qwen3", "hidden_size": 8, "vocab_size": 10}
    assert not is_embedding_model(tmp_path, config)  # a decoder without those files: chat
    assert embedding_spec(tmp_path, config).pooling == "last"  # vLLM's default for decoders
    bert = {**config, "model_type": "bert", "max_position_embeddings": 512}
    assert is_embedding_model(tmp_path, bert)
    assert embedding_spec(tmp_path, bert).pooling == "cls"
    last = sentence_transformers_dir(
        tmp_path / "last",
        {"pooling_mode_lasttoken": True, "pooling_mode_cls_token": False},
        "Pooling",
    )
    spec = embedding_spec(last, config)
    assert (spec.pooling, spec.normalize, spec.matryoshka) == ("last", False, None)
    assert is_embedding_model(last, config)
    dense = sentence_transformers_dir(
        tmp_path / "dense", {"pooling_mode_cls_token": True}, "Pooling", "Dense"
    )
    with pytest.raises(EmbeddingConfigError, match="Dense"):
        embedding_spec(dense, config)  # served without its projection, vectors would be wrong
    max_pool = sentence_transformers_dir(
        tmp_path / "max", {"pooling_mode_max_tokens": True}, "Pooling"
    )
    with pytest.raises(EmbeddingConfigError):
        embedding_spec(max_pool, config)
    any_size = embedding_spec(tmp_path, {**config, "is_matryoshka": True})
    assert any_size.matryoshka == ()
