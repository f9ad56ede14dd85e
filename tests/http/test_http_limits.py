"""Request limits over a real server: messages, tools and max_tokens past the server's caps
are 400s in OpenAI's envelope, naming the parameter, and cost the engine nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.http_helpers import chat_body, engine_of, running_server, validate_error


def tool(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}


def prompt_tokens_seen(server: Any) -> int:
    stats = engine_of(server).statistics().worker
    return stats.prompt_tokens_processed + stats.generated_tokens if stats else 0


async def test_requests_past_the_caps_are_400s_before_any_work(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, max_messages=3, max_tools=2, max_tokens_ceiling=5) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        before = prompt_tokens_seen(server)
        message = {"role": "user", "content": "hi"}
        refusals = {
            "messages": await http.post(
                "/v1/chat/completions", json={**chat_body(), "messages": [message] * 4}
            ),
            "tools": await http.post(
                "/v1/chat/completions", json=chat_body(tools=[tool(i) for i in range(3)])
            ),
            "max_tokens": await http.post("/v1/chat/completions", json=chat_body(max_tokens=6)),
            "max_completion_tokens": await http.post(
                "/v1/chat/completions", json=chat_body(max_completion_tokens=6)
            ),
            "max_output_tokens": await http.post(
                "/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 6}
            ),
            "input": await http.post(
                "/v1/responses", json={"model": "tiny", "input": [message] * 4}
            ),
        }
        for param, reply in refusals.items():
            assert reply.status_code == 400, param
            validate_error(reply.json())
            assert reply.json()["error"]["param"] == param
        assert refusals["tools"].json()["error"]["code"] == "too_many_items"
        assert refusals["input"].json()["error"]["code"] == "too_many_items"  # items counted
        assert prompt_tokens_seen(server) == before, "a refused request reached the engine"

        # Input within the cap, but with the turns it continues past it.
        first = await http.post(
            "/v1/responses", json={"model": "tiny", "input": [message] * 2, "max_output_tokens": 1}
        )
        follow_up = {"model": "tiny", "input": "hi", "previous_response_id": first.json()["id"]}
        longer = await http.post("/v1/responses", json=follow_up)
        assert longer.status_code == 400
        assert longer.json()["error"]["code"] == "conversation_too_long"
        assert longer.json()["error"]["param"] == "previous_response_id"

        # At the caps, served; a request that sets no max_tokens gets at most the ceiling
        # (the tiny model never stops by itself at temperature 0).
        at_caps = await http.post(
            "/v1/chat/completions",
            json=chat_body(
                messages=[message] * 3, tools=[tool(0), tool(1)], max_tokens=5, temperature=0
            ),
        )
        assert at_caps.status_code == 200
        unset = await http.post("/v1/chat/completions", json=chat_body(temperature=0))
        assert unset.json()["usage"]["completion_tokens"] == 5
        assert unset.json()["choices"][0]["finish_reason"] == "length"
