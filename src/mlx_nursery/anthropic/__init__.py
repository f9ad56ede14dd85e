"""The Anthropic layer: the Messages API (`/v1/messages`, `/v1/messages/count_tokens`).

It sits beside the OpenAI layer and builds on its core: a Messages request is checked
here, its conversation of content blocks rendered through the same chat-template core,
and it becomes the same engine request (`generation.Prepared`) with the same steps (sampling,
tools and tool_choice by constrained decoding, output format); its output (the same
`TextDelta` / `ToolCallOut` / `Finished`) is rendered here as Anthropic's message and
stream events. Errors are the OpenAI layer's, in Anthropic's envelope (`error_body`).
"""

from ._conversation import image_urls
from ._output import MessageContent, MessageEvents, error_body, error_status, message_body
from ._prepare import (
    count_tokens,
    parse_count_request,
    parse_messages_request,
    prepare_messages,
)
from ._schemas import MessagesRequest

__all__ = [
    "MessageContent",
    "MessageEvents",
    "MessagesRequest",
    "count_tokens",
    "error_body",
    "error_status",
    "image_urls",
    "message_body",
    "parse_count_request",
    "parse_messages_request",
    "prepare_messages",
]
