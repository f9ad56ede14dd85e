"""Priorities on the wire (decisions/0044): `priority` (vLLM's extension field, every API) and
OpenAI's `service_tier` (chat, Responses) through the official SDKs, the tier served echoed
as OpenAI echoes it, bad values a 400 in the envelope, and the waits counted by priority
on /metrics. The scheduling itself is the engine's (tests/engine/test_engine_priorities.py)."""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.http.test_http_metrics import samples, value
from tests.http_helpers import chat_body, running_server, sdk, validate, validate_error

HI = [{"role": "user", "content": "hi"}]


async def test_priority_and_service_tier_are_taken_echoed_and_checked(tiny_model: Path) -> None:
    async with (
        running_server(tiny_model, skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        client = sdk(server, max_retries=0)
        flex = await client.chat.completions.create(
            model="tiny", messages=HI, max_tokens=2, service_tier="flex"
        )
        # `priority` decides the class where both are sent; the echo is the tier served.
        urgent = await client.chat.completions.create(
            model="tiny",
            messages=HI,
            max_tokens=2,
            service_tier="auto",
            extra_body={"priority": -3},
        )
        plain = await client.chat.completions.with_raw_response.create(
            model="tiny", messages=HI, max_tokens=2, extra_body={"priority": 5}
        )
        stream = await client.chat.completions.create(
            model="tiny", messages=HI, max_tokens=2, stream=True, service_tier="priority",
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
        response = await client.responses.create(
            model="tiny", input="hi", max_output_tokens=2, service_tier="default"
        )
        unnamed = await client.responses.create(
            model="tiny", input="hi", max_output_tokens=2, extra_body={"priority": 1}
        )
        completion = await client.completions.create(
            model="tiny", prompt="Hi", max_tokens=2, extra_body={"priority": 1}
        )
        message = await anthropic.AsyncAnthropic(
            base_url=server.base_url, api_key="unused", max_retries=0
        ).messages.create(
            model="tiny", max_tokens=2, messages=HI,  # type: ignore[arg-type]
            service_tier="standard_only", extra_body={"priority": -1},
        )  # fmt: skip
        refused = []
        for fields in [
            {"priority": 101},
            {"priority": "high"},
            {"priority": 1.5},
            {"service_tier": "turbo"},
        ]:
            reply = await http.post("/v1/chat/completions", json=chat_body(max_tokens=2, **fields))
            refused.append((reply.status_code, reply.json()["error"]["param"]))
            validate_error(reply.json())
        with pytest.raises(openai.BadRequestError) as bad_tier:
            await client.responses.create(model="tiny", input="hi", service_tier="turbo")  # type: ignore[arg-type]
        messages_reply = await http.post(
            "/v1/messages",
            json={"model": "tiny", "max_tokens": 2, "messages": HI, "priority": -101},
        )
        metrics = samples((await http.get("/metrics")).text)
    assert (flex.service_tier, urgent.service_tier) == ("flex", "priority")
    assert "service_tier" not in plain.http_response.json()  # OpenAI echoes only a tier sent
    assert {chunk.service_tier for chunk in chunks} == {"priority"}
    validate(response.model_dump(exclude_unset=True), "Response")
    assert (response.service_tier, unnamed.service_tier) == ("default", None)
    assert completion.choices[0].finish_reason is not None
    assert message.stop_reason is not None
    assert refused == [(400, "priority")] * 3 + [(400, "service_tier")]
    assert bad_tier.value.body["param"] == "service_tier"  # type: ignore[index]
    assert messages_reply.status_code == 400
    assert messages_reply.json()["error"]["type"] == "invalid_request_error"
    counted = {
        priority: value(
            metrics, "mlx_nursery:request_queue_time_seconds_count",
            model_name="tiny", priority=priority,
        )
        for priority in ("-3", "-1", "0", "1", "5")
    }  # fmt: skip
    # -1: the priority tier (the stream) and the Messages request; 1: flex, the completion
    # and the Responses request with priority 1; 0: the Responses request at "default".
    assert counted == {"-3": 1, "-1": 2, "0": 1, "1": 3, "5": 1}
