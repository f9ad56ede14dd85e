"""Priorities on the wire (decisions/0044): `priority` (vLLM's extension field, every API) and
OpenAI's `service_tier` (chat, Responses) through the official SDKs, the tier served echoed
as OpenAI echoes it, bad values a 400 in the envelope, and the waits counted by priority
on /metrics; a saturated batch served by class, a running flex stream preempted for a priority
one. The scheduling rules are pinned on the engine (tests/engine/test_engine_priorities.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import anthropic
import httpx
import openai
import pytest
import trio

from tests.helpers import Gate
from tests.http.test_http_metrics import samples, value
from tests.http_helpers import (
    chat_body,
    engine_of,
    eventually,
    running_server,
    sdk,
    validate,
    validate_error,
)

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


class FirstSample:
    """A logits processor that notes, on the engine thread, when its request's first token
    is drawn: the order in which the engine served requests, with no clock."""

    def __init__(self, name: str, order: list[str]) -> None:
        self._name = name
        self._order = order
        self._seen = False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        if not self._seen:
            self._seen = True
            self._order.append(self._name)
        return logits


async def test_a_priority_request_runs_before_queued_flex_ones_and_all_finish(
    tiny_model: Path,
) -> None:
    """Two lanes, both held by flex (+1) streams, two more flex streams waiting: a request at
    `service_tier="priority"` (-1) takes the newest running one's lane at once (it is
    suspended, then resumes), so its first token comes before the waiting ones' (the order
    the engine drew first tokens in, not a clock). Every stream ends complete, the resumed
    one with exactly the tokens the others drew for the same prompt."""
    order: list[str] = []
    token = trio.lowlevel.current_trio_token()
    # Held at the first flex stream's first token (until the second holds a lane), then at
    # the second's second (both decoding) while the rest line up.
    gates = {"flex-1": Gate(token, at_call=1), "flex-2": Gate(token, at_call=2)}

    def processors(body: Any) -> tuple[Any, ...]:
        name = body["user"]
        gate = gates.get(name)
        return (FirstSample(name, order), *([gate] if gate else []))

    async with (
        running_server(
            tiny_model, skip_warmup=True, max_concurrency=2, extra_processors=processors
        ) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        client, engine = sdk(server, max_retries=0), engine_of(server)
        no_eos = {str(eos): -100 for eos in engine.model.eos_token_ids}
        outcomes: dict[str, tuple[str, str | None, int]] = {}

        async def ask(name: str, tier: Literal["flex", "priority"], max_tokens: int) -> None:
            stream = await client.chat.completions.create(
                model="tiny", messages=HI, max_tokens=max_tokens, stream=True, service_tier=tier,
                temperature=0, logit_bias=no_eos, user=name,
                stream_options={"include_usage": True},
            )  # fmt: skip
            text, finish, used = "", None, 0
            async for chunk in stream:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    finish = choice.finish_reason or finish
                used = chunk.usage.completion_tokens if chunk.usage else used
            outcomes[name] = (text, finish, used)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "flex-1", "flex", 24)
            await gates["flex-1"].reached.wait()
            nursery.start_soon(ask, "flex-2", "flex", 24)
            await eventually(lambda: engine.statistics().lanes_borrowed == 2, "both lanes held")
            gates["flex-1"].open()
            await gates["flex-2"].reached.wait()
            for waiting, name in enumerate(("flex-3", "flex-4"), start=1):
                nursery.start_soon(ask, name, "flex", 24)
                await eventually(lambda n=waiting: engine.statistics().queued == n, name)
            nursery.start_soon(ask, "urgent", "priority", 8)
            await eventually(lambda: engine.statistics().queued == 3, "the urgent one waits")
            gates["flex-2"].open()
        metrics = samples((await http.get("/metrics")).text)
        stats = engine.statistics()
    assert order == ["flex-1", "flex-2", "urgent", "flex-3", "flex-4"]
    assert stats.worker is not None and dict(stats.worker.priority_preemptions) == {1: 1}
    assert value(metrics, "mlx_nursery:priority_preemptions_total", model_name="tiny",
                 priority="1") == 1  # fmt: skip
    waits = {
        tier: value(metrics, "mlx_nursery:request_queue_time_seconds_count", model_name="tiny",
                    priority=tier)
        for tier in ("1", "-1")
    }  # fmt: skip
    assert waits == {"1": 4, "-1": 1}  # the resumed one is not counted again
    flex = {outcomes[f"flex-{n}"] for n in range(1, 5)}
    assert len(flex) == 1  # the preempted one resumed with the same tokens as the rest
    [(text, finish, used)] = flex
    assert (finish, used) == ("length", 24) and text
    assert outcomes["urgent"][1:] == ("length", 8)
    assert stats.lanes_borrowed == stats.queued == stats.suspended == 0
