"""The OpenAI wire's rules in the one converter (`generation`'s): the Responses API's input
items as tagged unions, replayed items read leniently, and the fields OpenAI (and vLLM's
rerank) leaves out rather than sending null. Imported by the package before anything is
structured: cattrs builds a class's hook on first use."""

from __future__ import annotations

from typing import Any

import attrs

from ..generation import (
    Tagged,
    register_lenient,
    register_tagged_union,
    register_unstructure_hook,
    to_json,
    unstructure_fields,
)
from . import _chat as chat
from . import _responses_objects as ro
from . import _responses_schemas as rs
from . import _scoring as scoring

register_tagged_union(
    rs.InputItem.__args__,
    Tagged(
        {
            "message": rs.MessageItem,
            "function_call": rs.FunctionCallItem,
            "function_call_output": rs.FunctionCallOutputItem,
            "reasoning": rs.ReasoningItem,
        },
        "input items of type {tag} are not supported",
        default=rs.MessageItem,
    ),
)
register_tagged_union(
    rs.ContentPart.__args__,
    Tagged(
        {
            **{kind: rs.TextPart for kind in ("input_text", "output_text", "text")},
            "input_image": rs.ImagePart,
        },
        "content parts of type {tag} are not supported (text and images only)",
        code="unsupported_content",
    ),
)
register_lenient(
    {
        rs.MessageItem,
        rs.FunctionCallItem,
        rs.FunctionCallOutputItem,
        rs.ReasoningItem,
        rs.TextPart,
        rs.ImagePart,
        rs.ReasoningText,
    }
)


def _without_tool_calls_if_none(message: chat.AssistantMessage) -> dict[str, Any]:
    out = {"content": message.content, "role": message.role, "refusal": message.refusal}
    if message.tool_calls is not None:
        out["tool_calls"] = to_json(message.tool_calls)
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    return out


register_unstructure_hook(chat.AssistantMessage, _without_tool_calls_if_none)
register_unstructure_hook(
    chat.ChatDelta,
    # OpenAI leaves unset delta fields out: `{"content": "x"}`, and `{}` on the final chunk;
    # the first delta, which names the role, always has `content` ("", or null before a
    # forced tool call) and `refusal` (null).
    lambda delta: {
        k: v
        for k, v in attrs.asdict(delta).items()
        if v is not None or (k in ("content", "refusal") and delta.role is not None)
    },
)
register_unstructure_hook(
    ro.ResponseText,
    # The echoed `text.format` leaves out the fields sent as null: the spec types them as
    # strings and booleans, not nullable.
    lambda text: {"format": {k: v for k, v in to_json(text.format).items() if v is not None}},
)
_response_fields = unstructure_fields(ro.Response)  # after ResponseText's hook


def _response(response: ro.Response) -> dict[str, Any]:
    """Absent rather than null, in their places: the spec types `top_logprobs`, `user` and
    `usage` as an integer, a string and an object (cattrs' omit_if_default would move them
    to the end); `service_tier` is there only when the request named one, as OpenAI's, and so
    are the echoed identifiers."""
    out = _response_fields(response)
    for name in (
        "top_logprobs",
        "user",
        "usage",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
    ):
        if out[name] is None:
            del out[name]
    return out


register_unstructure_hook(ro.Response, _response)


def _rerank_result(result: scoring.RerankResult) -> dict[str, Any]:
    """`document` left out, not null, when the request said `return_documents: false`
    (Jina's and Cohere's answer to it)."""
    out: dict[str, Any] = {"index": result.index}
    if result.document is not None:
        out["document"] = {"text": result.document.text}
    out["relevance_score"] = result.relevance_score
    return out


register_unstructure_hook(scoring.RerankResult, _rerank_result)
