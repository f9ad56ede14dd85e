"""/v1/chat/completions: a request validated and tokenized into a `Prepared`, and the chat
objects it renders (`ChatWire`): the body, and the stream's chunks in OpenAI's shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from ..engine import ImageInputs
from ..generation import (
    ChatMessage,
    Finished,
    InvalidRequest,
    LogprobEntry,
    Prepared,
    ServedModel,
    TemplateVariables,
    ToolCallOut,
    answer_only,
    check_count,
    check_prompt_size,
    common,
    forces_call,
    ignored_hints,
    ignored_values,
    last_user_text,
    offered_tools,
    prepared_for,
    prompt_texts,
    reject_unimplemented,
    render_served,
    require,
    structure,
    switchable,
    template_variables,
    thinking_switch,
    to_json,
    with_logprobs,
    with_processors,
    with_reasoning,
    with_response_format,
    with_tools,
)
from ._chat import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChunkChoice,
    FunctionCall,
    ToolCall,
)
from ._usage import UsageOut

_UNIMPLEMENTED: dict[str, object] = {
    # field: its no-op value(s); anything else is a 400 naming the field
    "functions": ([],),
    "function_call": "none",
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
}
_HINTS: dict[str, object] = {
    # field: its no-op value(s); anything else is accepted, ignored and named (or a 400, strict)
    "reasoning_effort": (),  # for a model that does not think (one that does acts on it)
    "verbosity": (),
    "prompt_cache_retention": (),  # the prefix cache keeps what its budget allows
    "prompt_cache_options": (),
    "moderation": (),  # no moderation here
    "store": False,  # no stored chat completions here
    "metadata": ({},),  # kept only with stored completions
}
_THINKING_HINTS = {k: v for k, v in _HINTS.items() if k != "reasoning_effort"}


class ChatWire:
    """Chat completion objects: the body, and the chunks of its stream."""

    prompt_param: ClassVar[str] = "messages"
    id_prefix: ClassVar[str] = "chatcmpl"
    trims_leading_space: ClassVar[bool] = True

    def body(
        self,
        p: Prepared,
        text: str,
        finished: Finished,
        calls: Sequence[ToolCallOut],
        logprobs: Sequence[LogprobEntry],
        reasoning: str | None,
    ) -> dict[str, Any]:
        message = AssistantMessage(
            text if text or not calls else None,
            tool_calls=[ToolCall(c.id, FunctionCall(c.name, c.arguments)) for c in calls] or None,
            reasoning_content=reasoning,
        )
        choice = ChatChoice(0, message, finished.reason, _logprobs(p, logprobs))
        usage = UsageOut.of(finished.usage, finished.reasoning_tokens)
        body = to_json(ChatCompletion(p.id, p.created, p.model, [choice], usage))
        return _with_tier(p, body)

    def opening_chunks(self, p: Prepared) -> list[dict[str, Any]]:
        """OpenAI's first delta: the role with empty content, or null content where the
        answer can only be a tool call."""
        return [_chunk(p, ChatDelta(role="assistant", content=None if p.calls_only else ""))]

    def reasoning_chunk(self, p: Prepared, text: str) -> dict[str, Any]:
        """A piece of a thinking model's reasoning: `delta.reasoning_content`, as vLLM and
        llama.cpp stream it."""
        return _chunk(p, ChatDelta(reasoning_content=text))

    def delta_chunk(
        self, p: Prepared, text: str, logprobs: Sequence[LogprobEntry], offset: int
    ) -> dict[str, Any]:
        return _chunk(p, ChatDelta(content=text), logprobs=_logprobs(p, logprobs))

    def tool_call_chunks(self, p: Prepared, call: ToolCallOut) -> list[dict[str, Any]]:
        """OpenAI's shape: the first fragment names the call, the next carries its arguments."""
        opening = {
            "index": call.index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        arguments = {"index": call.index, "function": {"arguments": call.arguments}}
        return [
            _chunk(p, ChatDelta(tool_calls=[opening])),
            _chunk(p, ChatDelta(tool_calls=[arguments])),
        ]

    def closing_chunks(self, p: Prepared, finished: Finished) -> list[dict[str, Any]]:
        chunks = [_chunk(p, ChatDelta(), finished.reason)]
        if p.include_usage:
            usage = UsageOut.of(finished.usage, finished.reasoning_tokens)
            last = to_json(ChatCompletionChunk(p.id, p.created, p.model, [], usage))
            chunks.append(_with_tier(p, last))
        return chunks


CHAT = ChatWire()


def _chunk(
    p: Prepared,
    delta: ChatDelta,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = ChunkChoice(0, delta, finish_reason, logprobs)
    chunk: dict[str, Any] = to_json(ChatCompletionChunk(p.id, p.created, p.model, [choice]))
    # OpenAI sends `usage: null` on every chunk only when usage was asked for.
    if not p.include_usage:
        del chunk["usage"]
    return _with_tier(p, chunk)


def _with_tier(p: Prepared, body: dict[str, Any]) -> dict[str, Any]:
    """The body or chunk with the service tier it was served at, when the request named one
    (OpenAI's answer then carries `service_tier`)."""
    if p.service_tier is not None:
        body["service_tier"] = p.service_tier
    return body


def _logprobs(p: Prepared, entries: Sequence[LogprobEntry]) -> dict[str, Any] | None:
    if p.token_text is None:
        return None
    return {"content": [e.chat() for e in entries], "refusal": None}


def prepare_chat(body: Any, served: ServedModel) -> Prepared:
    request = structure(body, ChatCompletionRequest)
    served.check(request.model)
    reject_unimplemented(request, _UNIMPLEMENTED)
    thinking = thinking_switch(served.thinking, request.reasoning_effort, "reasoning_effort")
    hints = _THINKING_HINTS if switchable(served.thinking) else _HINTS
    ignored = ignored_hints(request, hints, strict=served.strict_params)
    variables = template_variables(
        request.chat_template_kwargs, served.tokenizer, thinking, strict=served.strict_params
    )
    details = [  # the model's image processor decides each image's resolution
        part.image_url.get("detail")
        for message in request.messages
        if isinstance(message.content, list)
        for part in message.content
        if part.type == "image_url" and isinstance(part.image_url, dict)
    ]
    detail = next((d for d in details if d not in (None, "auto")), None)
    given = {"image_url.detail": detail} if detail is not None else {}
    ignored = (*ignored, *ignored_values(given, strict=served.strict_params), *variables.ignored)
    if request.max_tokens is not None and request.max_completion_tokens is not None:
        require(
            request.max_tokens == request.max_completion_tokens,
            "max_completion_tokens",
            "max_tokens and max_completion_tokens disagree; set only one",
        )
    budget, budget_param = (
        (request.max_completion_tokens, "max_completion_tokens")
        if request.max_completion_tokens is not None
        else (request.max_tokens, "max_tokens")
    )
    check_count(len(request.messages), served.caps.max_messages, "messages")
    checked = common(request, served, request.service_tier)
    tools, forced = offered_tools(request.tools, request.tool_choice, served)
    tokens, images = chat_prompt(served, request.messages, tools, variables)
    prepared = prepared_for(
        CHAT,
        request,
        served,
        tokens,
        budget,
        budget_param,
        checked,
        cache_key=request.prompt_cache_key,
        images=images,
        user_text=lambda: last_user_text(request.messages),
    )
    prepared = with_reasoning(prepared, served)
    prepared = with_response_format(
        prepared, served, request.response_format, "response_format", forced_call=forced is not None
    )
    prepared = with_processors(prepared, answer_only(prepared, served, forced))
    prepared = with_logprobs(prepared, served, _chat_logprobs(request, bool(tools)))
    # A forcing choice has tools by now (`offered_tools` refuses one without).
    prepared = attrs.evolve(prepared, ignored=ignored, calls_only=forces_call(request.tool_choice))
    return with_tools(prepared, served, tools, parallel=request.parallel_tool_calls is not False)


def chat_prompt(
    served: ServedModel,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]],
    variables: TemplateVariables,
    **rendering: Any,
) -> tuple[list[int], ImageInputs | None]:
    """A chat conversation's token ids (and images): the one rendering that chat completions
    and /tokenize's chat form share, so that a count is a chat request's prompt tokens.
    `rendering`: `render_served`'s other options (/tokenize's). Blocking: a worker thread."""
    check_prompt_size(served, prompt_texts(messages, tools), "messages")
    return render_served(
        served,
        messages,
        tools,
        thinking=variables.thinking,
        variables=variables.values,
        **rendering,
    )


def _chat_logprobs(request: ChatCompletionRequest, tools: bool) -> int | None:
    """Chat: `logprobs: true` turns them on; `top_logprobs` (0-20) adds alternatives."""
    if request.top_logprobs is not None:
        require(bool(request.logprobs), "top_logprobs", "top_logprobs needs logprobs: true")
        require(
            0 <= request.top_logprobs <= 20, "top_logprobs", "top_logprobs must be between 0 and 20"
        )
    if not request.logprobs:
        return None
    if tools:
        raise InvalidRequest(
            "logprobs together with tools are not supported",
            param="logprobs",
            code="unsupported_parameter",
        )
    return request.top_logprobs or 0
