"""Server-sent events framing: one JSON object per `data:` line, each event ended by a blank line.

The blank line matters: the OpenAI SDK silently drops an unterminated last event.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def data_event(payload: Any) -> bytes:
    return (
        b"data: "
        + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        + b"\n\n"
    )


def json_event(payload_json: str) -> bytes:
    return b"data: " + payload_json.encode() + b"\n\n"


def named_events(events: list[dict[str, Any]]) -> bytes:
    """Events named by their `type` (`event: <type>` before the data), as the Responses and
    Messages streams send them: the Anthropic SDK reads only named events."""
    return b"".join(
        f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()  # noqa: E501
        for e in events
    )
