"""/v1/embeddings on a real server, through the official SDK and httpx: a tiny random BERT
(the `tiny-embedding` preset, a sentence-transformers layout) served beside a chat model."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import trio
from transformers import AutoTokenizer

from mlx_nursery.engine import Embedder
from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    eventually,
    port_of,
    post_request,
    raw_http,
    running_server,
    sdk,
    server_thread,
    validate,
    validate_error,
)

CONTEXT = 128  # the preset's max_seq_length
WIDTH = 64  # its hidden size


@pytest.fixture(scope="module")
def beside_chat(tiny_embedding: Path, tiny_model: Path) -> Iterator[ThreadedServer]:
    """The embedding model served as `emb` beside the tiny chat model as `chat`, for the tests
    that ask only `emb` (none loads `chat`: one of them checks that it stays unloaded)."""
    with server_thread(
        None, model=(f"{tiny_embedding}=emb", f"{tiny_model}=chat"), max_loaded_models=2
    ) as served:
        yield served


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


async def test_texts_and_token_ids_in_floats_and_base64_through_the_sdk(
    tiny_embedding: Path, beside_chat: ThreadedServer
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_embedding))
    texts = ["hello world", "the model is a server that answers"]
    ids = [tokenizer.encode(t) for t in texts]
    async with borrowed(beside_chat) as running:
        client = sdk(running)
        floats = await client.embeddings.create(model="emb", input=texts, encoding_format="float")
        # The SDK asks for base64 by default when numpy is installed, and decodes it.
        default = await client.embeddings.create(model="emb", input=texts)
        alone = [
            (await client.embeddings.create(model="emb", input=t, encoding_format="float"))
            .data[0]
            .embedding
            for t in texts
        ]
        one_list = await client.embeddings.create(model="emb", input=ids[0])
        lists = await client.embeddings.create(model="emb", input=ids)
        async with httpx.AsyncClient(base_url=running.base_url) as http:
            raw = await http.post(
                "/v1/embeddings",
                json={"model": "emb", "input": texts, "encoding_format": "base64"},
            )
            plain = await http.post("/v1/embeddings", json={"model": "emb", "input": "hello"})

    assert [d.index for d in floats.data] == [0, 1]
    vectors = [np.array(d.embedding, dtype=np.float32) for d in floats.data]
    for vector in vectors:
        assert vector.shape == (WIDTH,)
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)  # 2_Normalize
    assert not np.allclose(vectors[0], vectors[1])
    tokens = sum(len(i) for i in ids)
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (tokens, tokens)
    assert floats.model == "emb"
    # base64 carries the same float32 values, little-endian
    assert [list(d.embedding) for d in default.data] == [list(v) for v in vectors]
    body = raw.json()  # the spec types `embedding` as floats only: base64 is checked here
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    decoded = np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), dtype="<f4")
    assert decoded.tolist() == vectors[1].tolist()
    validate(plain.json(), "CreateEmbeddingResponse")
    assert plain.json()["object"] == "list"
    # batched together or alone, the same vectors (padding is masked out)
    for together, single in zip(vectors, alone, strict=True):
        np.testing.assert_allclose(together, single, atol=1e-5)
    # token ids are embedded as given: the text's own ids give the text's vector
    np.testing.assert_allclose(one_list.data[0].embedding, vectors[0], atol=1e-5)
    assert one_list.usage.prompt_tokens == len(ids[0])
    for got, want in zip(lists.data, vectors, strict=True):
        np.testing.assert_allclose(got.embedding, want, atol=1e-5)


async def test_dimensions_cut_a_matryoshka_model_and_are_refused_elsewhere(
    tiny_embedding: Path, tiny_model: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "plain-embedding"
    shutil.copytree(tiny_embedding, plain)
    config = json.loads((plain / "config.json").read_text())
    del config["matryoshka_dimensions"]
    (plain / "config.json").write_text(json.dumps(config))
    async with running_server(
        None, model=(f"{tiny_embedding}=emb", f"{plain}=plain"), max_loaded_models=2
    ) as running:
        client = sdk(running)
        full = await client.embeddings.create(model="emb", input="hello", encoding_format="float")
        cut = await client.embeddings.create(
            model="emb", input="hello", dimensions=16, encoding_format="float"
        )
        whole = await client.embeddings.create(model="emb", input="hello", dimensions=WIDTH)
        with pytest.raises(openai.BadRequestError) as not_listed:
            await client.embeddings.create(model="emb", input="hello", dimensions=12)
        with pytest.raises(openai.BadRequestError) as not_trained:
            await client.embeddings.create(model="plain", input="hello", dimensions=16)
        models = await client.models.list()
    # cut, then normalized again: the first 16 of the pooled vector, as a unit vector
    head = np.array(full.data[0].embedding[:16], dtype=np.float32)
    np.testing.assert_allclose(cut.data[0].embedding, unit(head), atol=1e-5)
    np.testing.assert_allclose(whole.data[0].embedding, full.data[0].embedding, atol=1e-6)
    for refused in (not_listed.value, not_trained.value):
        assert refused.status_code == 400
        validate_error(refused.body and {"error": refused.body})
        assert refused.body["param"] == "dimensions"  # type: ignore[index]
    assert "16, 32, 64" in str(not_listed.value)
    kinds = {m.id: m.model_dump()["kind"] for m in models.data}
    assert kinds == {"emb": "embedding", "plain": "embedding"}


async def test_bad_inputs_get_400s_and_each_route_refuses_the_other_kind(
    beside_chat: ThreadedServer,
) -> None:
    async with (
        borrowed(beside_chat) as running,
        httpx.AsyncClient(base_url=running.base_url) as http,
    ):

        async def post(path: str, body: dict[str, Any]) -> httpx.Response:
            return await http.post(path, json=body)

        cases: list[tuple[dict[str, Any], str, str | None]] = [
            ({"input": ""}, "input", "invalid_value"),
            ({"input": ["fine", ""]}, "input[1]", "invalid_value"),
            ({"input": []}, "input", "invalid_value"),
            ({"input": [[1, 2], []]}, "input[1]", "invalid_value"),
            ({"input": [5, 99999]}, "input", "invalid_value"),
            ({"input": [-1]}, "input", "invalid_value"),
            ({"input": [7] * (CONTEXT + 1)}, "input", "context_length_exceeded"),
            ({"input": ["ok", [7] * 3]}, "input[1]", "invalid_type"),
            ({"input": [[1], [2.5]]}, "input[1]", "invalid_type"),
            ({"input": [1, True]}, "input[1]", "invalid_type"),
            ({"input": [{"text": "x"}]}, "input[0]", "invalid_type"),
            ({"input": [[7] * 4, [7] * (CONTEXT + 1)]}, "input[1]", "context_length_exceeded"),
            ({"input": ["x"] * 2049}, "input", "too_many_items"),
            ({"input": "x", "encoding_format": "int8"}, "encoding_format", None),
            ({"input": "x", "dimensions": 0}, "dimensions", "invalid_value"),
            ({"input": "x", "truncate": True}, "truncate", "unknown_parameter"),
            ({"input": 5}, "input", "invalid_type"),
            ({"input": None}, "input", "invalid_type"),
        ]
        for fields, param, code in cases:
            response = await post("/v1/embeddings", {"model": "emb", **fields})
            assert response.status_code == 400, (fields, response.text)
            error = response.json()
            validate_error(error)
            assert (error["error"]["param"], error["error"]["code"]) == (param, code), fields
        long_text = await post("/v1/embeddings", {"model": "emb", "input": "hello " * 200})
        assert long_text.json()["error"]["code"] == "context_length_exceeded"
        on_chat = await post("/v1/embeddings", {"model": "chat", "input": "hello"})
        chat_on_emb = await post(
            "/v1/chat/completions",
            {"model": "emb", "messages": [{"role": "user", "content": "hi"}]},
        )
        completion_on_emb = await post("/v1/completions", {"model": "emb", "prompt": "hi"})
        responses_on_emb = await post("/v1/responses", {"model": "emb", "input": "hi"})
        after = await post("/v1/embeddings", {"model": "emb", "input": "still serving"})
        listed = (await http.get("/v1/models")).json()
    for refused in (on_chat, chat_on_emb, completion_on_emb, responses_on_emb):
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "model_not_supported"
    assert after.status_code == 200
    kinds = {m["id"]: m["kind"] for m in listed["data"]}
    assert kinds == {"emb": "embedding", "chat": "text"}
    # the chat model was never loaded for a request that named it on the wrong route
    assert {m["id"]: m["loaded"] for m in listed["data"]}["chat"] is False


async def test_usage_counts_special_tokens_of_texts_and_none_for_token_ids(
    tiny_embedding: Path, beside_chat: ThreadedServer
) -> None:
    async with borrowed(beside_chat) as running:
        client = sdk(running)
        text = await client.embeddings.create(model="emb", input="hello")
        ids = await client.embeddings.create(model="emb", input=[5, 6, 7])
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_embedding))
    assert text.usage.prompt_tokens == len(tokenizer.encode("hello"))  # [CLS] ... [SEP]
    assert ids.usage.prompt_tokens == 3


LONG_INPUT = {"model": "tiny", "input": [[7] * CONTEXT] * 2048}
"""2048 forwards at --embedding-batch-size 1: far longer than any test waits."""


def embedder_of(running: Any) -> Embedder:
    (hosted,) = running.service.models.loaded()
    assert isinstance(hosted.engine, Embedder)
    return hosted.engine


async def test_a_client_that_leaves_or_a_cancel_by_id_stops_the_compute_within_a_forward(
    tiny_embedding: Path,
) -> None:
    async with running_server(tiny_embedding, embedding_batch_size=1) as running:
        embedder = embedder_of(running)
        connection = await raw_http(port_of(running), post_request("/v1/embeddings", LONG_INPUT))
        await eventually(lambda: embedder.forwards >= 1, "the request computes")
        await connection.aclose()
        await eventually(lambda: embedder.statistics().lanes_borrowed == 0, "its lane is back")
        stats = embedder.statistics()
        assert stats.cancellations.confirmed == 1
        assert sum(stats.cancellations.steps_in_flight[2:]) == 0  # at most one forward on
        assert embedder.forwards < 2048
        after = await sdk(running).embeddings.create(model="tiny", input="next")
        assert len(after.data) == 1
        assert not running.service.models.slots[0].busy
        registry = running.parts.metrics.registry
        labels = {"model_name": "tiny", "cause": "client"}
        assert registry.get_sample_value("mlx_nursery:request_cancelled_total", labels) == 1
        tokens = registry.get_sample_value(
            "mlx_nursery:prompt_tokens_total", {"model_name": "tiny"}
        )
        assert tokens == after.usage.prompt_tokens  # the finished request's, not the cancelled

        # Cancelled by its id from another request: the same stop, the cancel's 409.
        answers: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=running.base_url, timeout=60) as http:

            async def ask() -> None:
                headers = {"x-request-id": "emb-1"}
                answers.append(await http.post("/v1/embeddings", json=LONG_INPUT, headers=headers))

            async with trio.open_nursery() as nursery:
                forwards = embedder.forwards
                nursery.start_soon(ask)
                await eventually(lambda: embedder.forwards > forwards, "the request computes")
                assert (await http.post("/v1/requests/emb-1/cancel")).status_code == 200
        (answer,) = answers
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "request_cancelled"
        assert embedder.statistics().cancellations.confirmed == 2
        assert embedder.forwards - forwards < 2048
        labels = {"model_name": "tiny", "cause": "cancel"}
        assert registry.get_sample_value("mlx_nursery:request_cancelled_total", labels) == 1


async def test_the_deadline_and_the_shutdown_cancel_the_compute_with_their_errors(
    tiny_embedding: Path,
) -> None:
    async with running_server(tiny_embedding, embedding_batch_size=1, request_timeout=1) as running:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=60) as http:
            late = await http.post("/v1/embeddings", json=LONG_INPUT)
        embedder = embedder_of(running)
        await eventually(lambda: embedder.statistics().lanes_borrowed == 0, "its lane is back")
        assert embedder.statistics().cancellations.confirmed == 1
    assert late.status_code == 504
    assert late.json()["error"]["code"] == "request_timeout"

    answers: list[httpx.Response] = []

    async def ask(base_url: str) -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            answers.append(await http.post("/v1/embeddings", json=LONG_INPUT))

    async with (
        trio.open_nursery() as nursery,
        running_server(tiny_embedding, embedding_batch_size=1, shutdown_grace=0.2) as running,
    ):
        embedder = embedder_of(running)
        nursery.start_soon(ask, running.base_url)
        await eventually(lambda: embedder.forwards >= 1, "the request computes")
        # the block's end shut the server down: the drain cancelled the request after its grace
    (answer,) = answers
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "server_shutting_down"
    assert embedder.forwards < 2048
