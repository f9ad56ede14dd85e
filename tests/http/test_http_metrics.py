"""GET /metrics through a real server, parsed by prometheus-client's own parser; its counters
checked against the requests made."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from mlx_nursery.engine import default_memory_budget
from tests.http_helpers import chat_body, engine_of, eventually, running_server


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def weight_bytes(model: Path) -> int:
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))


def value(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_count_the_requests_tokens_and_latencies(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, request_timeout=30) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        replies = [
            await http.post("/v1/chat/completions", json=chat_body(max_tokens=5, temperature=0)),
            await http.post(
                "/v1/chat/completions", json=chat_body(max_tokens=3, stream=True, temperature=0)
            ),
            await http.post(
                "/v1/completions",
                json={"model": "tiny", "prompt": "Hi", "max_tokens": 4, "temperature": 0},
            ),
            await http.post("/v1/chat/completions", json={"model": "tiny"}),  # 400: no messages
        ]
        assert [r.status_code for r in replies] == [200, 200, 200, 400]
        # A client that leaves mid-stream, once it has 3 pieces of text: counted as
        # cancelled by the client, its tokens as generated.
        pieces = 0
        with trio.move_on_after(30):
            async with http.stream(
                "POST",
                "/v1/chat/completions",
                json=chat_body(max_tokens=4000, temperature=0, stream=True),
            ) as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data: {"):
                        delta = json.loads(line[len("data: ") :])["choices"][0]["delta"]
                        pieces += bool(delta.get("content"))
                    if pieces == 3:
                        break
        assert pieces == 3
        registry = server.parts.metrics.registry
        labels = {"model_name": "tiny", "cause": "client"}
        await eventually(  # the job ends just after the client left
            lambda: registry.get_sample_value("mlx_nursery:request_cancelled_total", labels),
            "the client's cancel counted",
        )
        kv_tokens = engine_of(server).model.kv_budget_tokens
        scraped = await http.get("/metrics")
        assert scraped.status_code == 200
        assert scraped.headers["content-type"].startswith("text/plain")
        m = samples(scraped.text)

    chat = "/v1/chat/completions"
    assert value(m, "mlx_nursery:http_requests_total", route=chat, status="200") == 3
    assert value(m, "mlx_nursery:http_requests_total", route=chat, status="400") == 1
    assert value(m, "mlx_nursery:http_requests_total", route="/v1/completions", status="200") == 1
    assert (
        value(m, "mlx_nursery:request_success_total", model_name="tiny", finished_reason="length")
        == 3
    )
    # Every token generated: the finished requests' and the one the client left (each
    # piece it read is a token at least).
    assert value(m, "mlx_nursery:generation_tokens_total", model_name="tiny") >= 5 + 3 + 4 + 3
    assert [name for name, _ in m if name.endswith("_created")] == []
    assert value(m, "mlx_nursery:time_to_first_token_seconds_count", model_name="tiny") >= 3
    assert value(m, "mlx_nursery:e2e_request_latency_seconds_count", model_name="tiny") == 3
    assert value(m, "mlx_nursery:time_per_output_token_seconds_count", model_name="tiny") == 3
    assert value(m, "mlx_nursery:num_requests_running", model_name="tiny") >= 0
    assert value(m, "mlx_nursery:engine_healthy", model_name="tiny") == 1
    assert value(m, "mlx_nursery:prefix_cache_queries_total", model_name="tiny") >= 3
    # MLX's own memory counters: the weights are in arrays; freed buffers kept for reuse are
    # a family of their own (what the process holds beyond its arrays).
    assert value(m, "mlx_nursery:memory_active_bytes") > 0
    assert ("mlx_nursery:memory_cache_bytes", ()) in m
    # What the model reserves, by part: its weights, its prefix cache's budget (by default a
    # quarter of what the memory budget, 80% of this machine's RAM, leaves after the
    # weights, at least 2 GiB), and the KV its engine may use: with no --memory-budget the
    # device's share would be most of the machine, but 8 sequences of the 4,096-token
    # context, each with a step of room to grow, hold 8 x 4,608 tokens (in steps of 256) of
    # 512 bytes: no more is kept from other models.
    reserved = {
        part: value(m, "mlx_nursery:model_reserved_bytes", model_name="tiny", part=part)
        for part in ("weights", "prefix_cache", "kv")
    }
    budget = default_memory_budget()
    assert budget is not None
    weights = weight_bytes(tiny_model)
    assert reserved == {
        "weights": weights,
        "prefix_cache": max(2 << 30, (budget - weights) // 4),
        "kv": 8 * 4608 * 512,
    }
    assert kv_tokens == 8 * 4608


async def test_speculation_is_reported_in_usage_and_metrics(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, request_timeout=30, speculative="ngram") as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        body = chat_body("Repeat: one two three, one two three.", max_tokens=30, temperature=0)
        reply = await http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200
        details = reply.json()["usage"]["completion_tokens_details"]
        m = samples((await http.get("/metrics")).text)
    accepted = details["accepted_prediction_tokens"]
    drafted = accepted + details["rejected_prediction_tokens"]
    assert drafted > 0  # the tiny model repeats itself: its first steps find drafts
    assert value(m, "mlx_nursery:spec_decode_num_draft_tokens_total", model_name="tiny") == drafted
    assert value(m, "mlx_nursery:spec_decode_num_accepted_tokens_total", model_name="tiny") == (
        accepted
    )
    assert value(m, "mlx_nursery:spec_decode_num_drafts_total", model_name="tiny") >= 1


async def test_a_draft_model_drafts_for_the_served_one(tiny_model: Path) -> None:
    """--draft-model implies --speculative draft: the served model drafts with it (here
    itself, so its greedy drafts hold) and usage reports the drafts."""
    async with (
        running_server(tiny_model, request_timeout=30, draft_model=str(tiny_model)) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        engine = engine_of(server)
        assert engine is not None and engine.config.speculation is not None
        assert engine.config.speculation.method == "draft"
        body = chat_body("Tell me a story.", max_tokens=30, temperature=0)
        reply = await http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200
        details = reply.json()["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0
