"""One client cannot stall every other: attacks on request preparation through a real server.

Each attack is either refused before its work (a 400 naming the limit) or runs while a
victim, another client's 1-token chat on the same server, is served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from .http_helpers import chat_body, running_server, validate_error

EMPTY_REASONING = {"type": "reasoning", "summary": []}


async def victim_served(http: httpx.AsyncClient) -> None:
    """Another client's 1-token chat is answered."""
    reply = await http.post("/v1/chat/completions", json=chat_body(max_tokens=1, temperature=0))
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 1


def responses_attack(reasoning_items: int, last: dict[str, Any]) -> dict[str, Any]:
    """A Responses input of empty reasoning items (they add no message), then `last`."""
    return {
        "model": "tiny",
        "input": [EMPTY_REASONING] * reasoning_items + [last],
        "max_output_tokens": 1,
        "temperature": 0,
    }


async def test_responses_input_items_are_counted_before_they_are_read(tiny_model: Path) -> None:
    """Empty reasoning items add no message, so the message limit alone never tripped, and
    naming each message's item re-read the input once per item (quadratic). Items now count
    against --max-messages in the raw body, and within it the input is read in one pass."""
    user = {"role": "user", "content": "Hi"}
    async with (
        running_server(tiny_model, max_messages=15_000) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        refused = await http.post("/v1/responses", json=responses_attack(15_000, user))
        assert refused.status_code == 400
        validate_error(refused.json())
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("too_many_items", "input")
        await victim_served(http)

        # Within the limit: prepared, and an error still names the item its message came from.
        taken = await http.post("/v1/responses", json=responses_attack(12_000, user))
        assert taken.status_code == 200, taken.text
        image = {"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}
        named = await http.post("/v1/responses", json=responses_attack(12_000, image))
        assert named.status_code == 400
        assert named.json()["error"]["param"] == "input[12000].content[0].type"
        await victim_served(http)
