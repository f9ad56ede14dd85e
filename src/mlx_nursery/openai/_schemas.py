"""Wire schemas of the requests we accept: plain attrs classes, structured by `_converter`.

Every field OpenAI defines for these endpoints is declared, so that a field we
do not implement is rejected by name (see `_params.reject_unimplemented`)
rather than failing as "unrecognized". Fields that are not OpenAI's but
are common among local servers (top_k, min_p, repetition_penalty) are ours.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

Role = Literal["system", "developer", "user", "assistant", "tool"]


@attrs.define
class ContentPart:
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


@attrs.define
class ChatMessage:
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    function_call: Any = None
    audio: Any = None


@attrs.define
class StreamOptions:
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


@attrs.define
class SamplingFields:
    """Fields chat and completions share; see `_params.sampling_from`."""

    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    user: str | None = None


@attrs.define(kw_only=True)
class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None
    service_tier: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None


@attrs.define(kw_only=True)
class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None
