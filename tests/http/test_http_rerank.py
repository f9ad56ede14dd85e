"""/v1/rerank and /v1/score (and /rerank, /score) on a real server: a tiny random BERT
cross-encoder (`tiny-reranker`) whose scores are checked against a direct computation, an
embedding model (`tiny-embedding`) scoring by cosine, and a chat model they refuse.

One server serves the module (its own thread: `server_thread`), behind an API key, with four
inputs to a forward so that a request's pairs share forwards in chunks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from transformers import AutoTokenizer

from mlx_nursery.engine import Embedder
from mlx_nursery.server import Running
from mlx_nursery.serving._slots import HostedEmbedder
from tests.http_helpers import eventually, port_of, raw_http, server_thread, validate_error
from tests.scoring_helpers import direct_logits, sigmoid

CONTEXT = 128  # the tiny reranker's positions
KEY = "sk-rerank"
HEADERS = {"Authorization": f"Bearer {KEY}"}
QUERY = "what is the capital of the country"
DOCS = [
    "the capital is a city",
    "one two three",
    "what is the capital of the country",
    "he was at the house",
    "they are with his",
]


@pytest.fixture(scope="module")
def server(tiny_reranker: Path, tiny_embedding: Path, tiny_model: Path) -> Iterator[Running]:
    with server_thread(
        None,
        model=(f"{tiny_reranker}=rr", f"{tiny_embedding}=emb", f"{tiny_model}=chat"),
        max_loaded_models=3,
        embedding_batch_size=4,
        api_key=(KEY,),
    ) as served:
        yield served.running


@pytest.fixture
async def http(server: Running) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, headers=HEADERS, timeout=60) as client:
        yield client


async def engine_of(server: Running, http: httpx.AsyncClient, name: str) -> Embedder:
    """`name`'s engine, loaded by a request if it was not."""
    answer = await http.post("/v1/score", json={"model": name, "text_1": "a", "text_2": "b"})
    assert answer.status_code == 200, answer.text
    models = server.service.models
    assert models is not None
    (hosted,) = [h for h in models.loaded() if h.card.id == name]
    assert isinstance(hosted, HostedEmbedder)
    return hosted.engine


def metric(server: Running, name: str, **labels: str) -> float:
    return server.parts.metrics.registry.get_sample_value(f"mlx_nursery:{name}", labels) or 0.0


def pair_tokens(model: Path, pairs: list[tuple[str, str]], **tokenizing: Any) -> int:
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    return sum(len(tokenizer(q, d, **tokenizing)["input_ids"]) for q, d in pairs)


async def test_rerank_orders_documents_by_the_cross_encoders_scores(
    server: Running, http: httpx.AsyncClient, tiny_reranker: Path
) -> None:
    engine = await engine_of(server, http, "rr")
    body = {"model": "rr", "query": QUERY, "documents": DOCS}
    routes = {
        r: metric(server, "http_requests_total", route=r, status="200")
        for r in ("/v1/rerank", "/rerank")
    }
    before = engine.forwards
    answer = await http.post("/v1/rerank", json=body)
    forwards = engine.forwards - before
    unversioned = await http.post("/rerank", json=body)
    top = await http.post("/v1/rerank", json={**body, "top_n": 2, "return_documents": False})
    logits = await http.post("/v1/rerank", json={**body, "use_activation": False, "top_n": 0})
    # Cohere's and Jina's documents as {"text": ...} objects: the same ranking.
    objects = [{"text": d} if i % 2 else d for i, d in enumerate(DOCS)]
    as_objects = await http.post("/v1/rerank", json={**body, "documents": objects})
    assert (
        as_objects.json()["results"] == (await http.post("/v1/rerank", json=body)).json()["results"]
    )
    assert answer.status_code == 200, answer.text
    assert forwards == 2  # five pairs, four to a forward: one request, chunked by the batch size
    want = [sigmoid(x) for x in direct_logits(tiny_reranker, [(QUERY, d) for d in DOCS])]
    out = answer.json()
    assert set(out) == {"id", "model", "usage", "results"}
    assert out["id"].startswith("rerank-") and out["model"] == "rr"
    results = out["results"]
    assert [r["index"] for r in results] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    for result in results:
        assert result["relevance_score"] == pytest.approx(want[result["index"]], abs=1e-5)
        assert result["document"] == {"text": DOCS[result["index"]]}
    assert len({round(w, 4) for w in want}) == len(DOCS)  # the order is the scores', not a tie's
    tokens = pair_tokens(tiny_reranker, [(QUERY, d) for d in DOCS])
    assert out["usage"] == {"total_tokens": tokens}
    assert [(r["index"], r["relevance_score"]) for r in unversioned.json()["results"]] == [
        (r["index"], r["relevance_score"]) for r in results
    ]
    assert top.json()["results"] == [
        {"index": r["index"], "relevance_score": r["relevance_score"]} for r in results[:2]
    ]
    for result in logits.json()["results"]:  # use_activation false: the logit itself
        assert sigmoid(result["relevance_score"]) == pytest.approx(want[result["index"]], abs=1e-5)
    assert (
        metric(server, "http_requests_total", route="/v1/rerank", status="200")
        == routes["/v1/rerank"] + 5  # three, and the two of the objects' comparison
    )
    assert (
        metric(server, "http_requests_total", route="/rerank", status="200")
        == routes["/rerank"] + 1
    )
    # the model's weights are what it reserves of the memory budget (no KV, no prefix cache)
    weights = (tiny_reranker / "model.safetensors").stat().st_size
    reserved = {
        part: metric(server, "model_reserved_bytes", model_name="rr", part=part)
        for part in ("weights", "prefix_cache", "kv")
    }
    assert reserved == {"weights": weights, "prefix_cache": 0, "kv": 0}


async def test_score_pairs_one_to_one_one_to_many_and_many_to_many(
    http: httpx.AsyncClient, tiny_reranker: Path
) -> None:
    async def score(path: str = "/v1/score", **fields: Any) -> httpx.Response:
        return await http.post(path, json={"model": "rr", **fields})

    one = await score(text_1=QUERY, text_2=DOCS[0])
    one_to_n = await score(text_1=QUERY, text_2=DOCS)
    listed = await score("/score", text_1=[QUERY], text_2=DOCS)
    n_to_n = await score(text_1=[QUERY, DOCS[1]], text_2=[DOCS[0], DOCS[3]])
    n_to_one = await score(text_1=[QUERY, DOCS[1]], text_2=DOCS[0])
    uneven = await score(text_1=[QUERY, DOCS[1]], text_2=DOCS[:3])
    pairs = [(QUERY, d) for d in DOCS]
    want = [sigmoid(x) for x in direct_logits(tiny_reranker, [*pairs, (DOCS[1], DOCS[3])])]
    body = one_to_n.json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["id"].startswith("score-") and body["object"] == "list"
    assert isinstance(body["created"], int) and body["model"] == "rr"
    assert [(d["index"], d["object"]) for d in body["data"]] == [(i, "score") for i in range(5)]
    np.testing.assert_allclose([d["score"] for d in body["data"]], want[:5], atol=1e-5)
    tokens = pair_tokens(tiny_reranker, pairs)
    assert body["usage"] == {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
    }
    assert [d["score"] for d in one.json()["data"]] == [body["data"][0]["score"]]
    assert listed.json()["data"] == body["data"]
    np.testing.assert_allclose(
        [d["score"] for d in n_to_n.json()["data"]], [want[0], want[5]], atol=1e-5
    )
    for refused in (n_to_one, uneven):
        assert refused.status_code == 400, refused.text
        validate_error(refused.json())
        assert refused.json()["error"]["param"] == "text_2"
        assert "1:1, 1:N" in refused.json()["error"]["message"]


async def test_an_embedding_model_scores_by_cosine_and_its_own_text_first(
    http: httpx.AsyncClient,
) -> None:
    docs = ["he was at the house", QUERY, "one two three"]
    answer = await http.post("/v1/rerank", json={"model": "emb", "query": QUERY, "documents": docs})
    vectors = await http.post(
        "/v1/embeddings", json={"model": "emb", "input": [QUERY, *docs], "encoding_format": "float"}
    )
    n_to_n = await http.post(
        "/v1/score", json={"model": "emb", "text_1": [QUERY, docs[0]], "text_2": [docs[0], docs[0]]}
    )
    activation = await http.post(
        "/v1/score", json={"model": "emb", "text_1": "a", "text_2": "b", "use_activation": True}
    )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert results[0]["index"] == 1  # the query's own text
    assert results[0]["relevance_score"] == pytest.approx(1.0, abs=1e-5)
    rows = [np.array(d["embedding"], dtype=np.float64) for d in vectors.json()["data"]]
    cosine = [float(rows[0] @ v / np.linalg.norm(rows[0]) / np.linalg.norm(v)) for v in rows[1:]]
    for result in results:
        assert result["relevance_score"] == pytest.approx(cosine[result["index"]], abs=1e-5)
    # each text embedded once: the query's tokens count once
    assert answer.json()["usage"]["total_tokens"] == vectors.json()["usage"]["prompt_tokens"]
    np.testing.assert_allclose(
        [d["score"] for d in n_to_n.json()["data"]], [cosine[0], 1.0], atol=1e-5
    )
    assert activation.status_code == 400
    assert activation.json()["error"]["param"] == "use_activation"


async def test_truncate_prompt_tokens_cuts_pairs_and_without_it_too_long_is_a_400(
    http: httpx.AsyncClient, tiny_reranker: Path
) -> None:
    long = "the " * 150
    documents = ["a city", long]

    async def rerank(**fields: Any) -> httpx.Response:
        body = {"model": "rr", "query": QUERY, "documents": documents, **fields}
        return await http.post("/v1/rerank", json=body)

    refused = await rerank()
    whole = await rerank(truncate_prompt_tokens=-1)
    cut = await rerank(truncate_prompt_tokens=20)
    too_many = await rerank(truncate_prompt_tokens=CONTEXT + 1)
    too_few = await rerank(truncate_prompt_tokens=3)
    assert refused.status_code == 400
    assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == (
        "documents[1]",
        "context_length_exceeded",
    )
    pairs = [(QUERY, d) for d in documents]
    assert whole.json()["usage"]["total_tokens"] == pair_tokens(tiny_reranker, pairs[:1]) + CONTEXT
    want = [sigmoid(x) for x in direct_logits(tiny_reranker, pairs, truncation=True, max_length=20)]
    scores = {r["index"]: r["relevance_score"] for r in cut.json()["results"]}
    np.testing.assert_allclose([scores[0], scores[1]], want, atol=1e-5)
    assert cut.json()["usage"]["total_tokens"] == pair_tokens(
        tiny_reranker, pairs, truncation=True, max_length=20
    )
    for bad in (too_many, too_few):
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "truncate_prompt_tokens"


async def test_bad_input_is_a_400_in_the_envelope_and_other_kinds_are_refused(
    server: Running, http: httpx.AsyncClient
) -> None:
    rerank_cases: list[tuple[dict[str, Any], str, str | None]] = [
        ({"documents": []}, "documents", "invalid_value"),
        ({"documents": ["ok", ""]}, "documents[1]", "invalid_value"),
        ({"documents": ["ok", 5]}, "documents[1]", None),
        ({"documents": "one"}, "documents", None),
        ({"query": 5}, "query", None),
        ({"query": ""}, "query", "invalid_value"),
        ({"top_n": -1}, "top_n", "invalid_value"),
        ({"documents": ["x"] * 1001}, "documents", "too_many_items"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "invalid_value"),
        ({"priority": 1}, "priority", "unknown_parameter"),
    ]
    for fields, param, code in rerank_cases:
        body = {"model": "rr", "query": QUERY, "documents": DOCS, **fields}
        response = await http.post("/v1/rerank", json=body)
        assert response.status_code == 400, (fields, response.text)
        validate_error(response.json())
        assert (response.json()["error"]["param"], response.json()["error"]["code"]) == (
            param,
            code,
        )
    score_cases: list[tuple[dict[str, Any], str]] = [
        ({"text_1": [], "text_2": "x"}, "text_1"),
        ({"text_1": "a", "text_2": [""]}, "text_2[0]"),
        ({"text_1": {"content": []}, "text_2": "x"}, "text_1"),
        ({"text_1": "a"}, "text_2"),
    ]
    for fields, param in score_cases:
        response = await http.post("/v1/score", json={"model": "rr", **fields})
        assert response.status_code == 400, (fields, response.text)
        validate_error(response.json())
        assert response.json()["error"]["param"] == param, fields
    on_chat = await http.post(
        "/v1/rerank", json={"model": "chat", "query": "a", "documents": ["b"]}
    )
    score_on_chat = await http.post(
        "/v1/score", json={"model": "chat", "text_1": "a", "text_2": "b"}
    )
    embed_on_rr = await http.post("/v1/embeddings", json={"model": "rr", "input": "hello"})
    chat_on_rr = await http.post(
        "/v1/chat/completions",
        json={"model": "rr", "messages": [{"role": "user", "content": "hi"}]},
    )
    for refused in (on_chat, score_on_chat, embed_on_rr, chat_on_rr):
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "model_not_supported"
    assert "/v1/rerank" in on_chat.json()["error"]["message"]
    assert "reranker" in embed_on_rr.json()["error"]["message"]
    async with httpx.AsyncClient(base_url=server.base_url) as keyless:
        for path in ("/rerank", "/score", "/v1/rerank"):
            assert (await keyless.post(path, json={})).status_code == 401, path
    listed = (await http.get("/v1/models")).json()["data"]
    assert {m["id"]: m["kind"] for m in listed} == {
        "rr": "reranker",
        "emb": "embedding",
        "chat": "text",
    }
    assert {m["id"]: m["loaded"] for m in listed}["chat"] is False  # refused before any load
    after = await http.post("/v1/rerank", json={"model": "rr", "query": "a", "documents": ["b"]})
    assert after.status_code == 200


async def test_a_client_that_leaves_stops_the_scoring_within_a_forward(
    server: Running, http: httpx.AsyncClient
) -> None:
    engine = await engine_of(server, http, "rr")
    forwards, confirmed = engine.forwards, engine.statistics().cancellations.confirmed
    cancelled = metric(server, "request_cancelled_total", model_name="rr", cause="client")
    # 1000 pairs of ~64 tokens: 250 forwards of four, far longer than the test waits
    body = json.dumps({"model": "rr", "query": "a", "documents": ["the " * 60] * 1000}).encode()
    head = (
        f"POST /v1/rerank HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    connection = await raw_http(port_of(server), head.encode() + body)
    await eventually(lambda: engine.forwards > forwards, "the request computes")
    await connection.aclose()
    await eventually(lambda: engine.statistics().lanes_borrowed == 0, "its lane is back")
    stats = engine.statistics()
    assert stats.cancellations.confirmed == confirmed + 1
    assert sum(stats.cancellations.steps_in_flight[2:]) == 0  # at most one forward ran on
    assert engine.forwards - forwards < 250
    assert (
        metric(server, "request_cancelled_total", model_name="rr", cause="client") == cancelled + 1
    )
    after = await http.post("/v1/score", json={"model": "rr", "text_1": "a", "text_2": "b"})
    assert after.status_code == 200
