"""The Responses API's preparation: a request checked, its input items and the stored
conversation rendered into a chat prompt, its tools, format and logprobs applied.

A response's conversation (chat messages, instructions excluded) is what a follow-up with
`previous_response_id` replays; `instructions` apply to one response only.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from ..generation import (
    ChatMessage,
    InvalidRequest,
    NamedToolChoice,
    Prepared,
    SamplingFields,
    ServedModel,
    ToolChoiceMode,
    ToolChoiceType,
    WireTraits,
    answer_only,
    check_count,
    check_prompt_size,
    checkpoint,
    common,
    ignored_hints,
    ignored_values,
    last_user_text,
    offered_tools,
    prepared_for,
    prompt_texts,
    quoted,
    reject_unimplemented,
    render_served,
    require,
    structure,
    switchable,
    thinking_switch,
    with_logprobs,
    with_processors,
    with_reasoning,
    with_response_format,
    with_tools,
)
from ._responses_items import input_items, item_id, messages_and_origins
from ._responses_schemas import ImagePart, MessageItem, ResponsesRequest

LOGPROBS_INCLUDE = "message.output_text.logprobs"
REASONING_INCLUDE = "reasoning.encrypted_content"
"""Satisfied as asked: a thinking model's reasoning items carry their text in `content`,
which a client replays as it is; nothing is encrypted (Codex-style clients send it with
store: false)."""
_INCLUDABLE = (LOGPROBS_INCLUDE, REASONING_INCLUDE)
RESPONSES_WIRE = WireTraits(prompt_param="input", id_prefix="resp", trims_leading_space=True)
"""What a Responses plan needs of its wire (a prompt too long names `input`)."""
_UNIMPLEMENTED: dict[str, object] = {
    "prompt": (),
    "conversation": (),
    "image": (),  # no image generation here
    "truncation": ("disabled", "auto"),
}
_HINTS: dict[str, object] = {
    # field: its no-op value(s); anything else is accepted, ignored and named (or a 400, strict)
    "prompt_cache_retention": (),  # the prefix cache keeps what its budget allows
    "prompt_cache_options": (),
    "moderation": (),  # no moderation here
    "context_management": (),  # no server-side compaction: a long context is refused whole
    "background_options": (),
    "access_programs": (),
    # For a model that does not think; a thinking one acts on `reasoning.effort`.
    "reasoning": ({}, {"effort": None}, {"summary": None}, {"effort": None, "summary": None}),
}
_THINKING_HINTS = {k: v for k, v in _HINTS.items() if k != "reasoning"}


def check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's bounds on `metadata`: at most 16 pairs, keys of at most 64 characters, values
    of at most 512."""
    if metadata is None:
        return
    if len(metadata) > 16:
        raise InvalidRequest(
            "metadata takes at most 16 keys", param="metadata", code="invalid_value"
        )
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise InvalidRequest(
                f"metadata keys take at most 64 characters and values 512 ({quoted(key)})",
                param="metadata",
                code="invalid_value",
            )


def parse_request(body: Any, *, max_items: int) -> ResponsesRequest:
    """The request, checked. `input` may hold at most `max_items` items (`--max-messages`),
    counted before anything is built from them."""
    given = body.get("input") if isinstance(body, dict) else None
    check_count(len(given) if isinstance(given, list) else 0, max_items, "input")
    request = structure(body, ResponsesRequest)
    reject_unimplemented(request, _UNIMPLEMENTED)
    for i, included in enumerate(request.include or []):
        if included not in _INCLUDABLE:
            raise InvalidRequest(
                f"include {quoted(included)} is not supported by this server",
                param=f"include[{i}]",
                code="unsupported_parameter",
            )
    if request.background and request.store is False:
        raise InvalidRequest(
            "Background responses must be stored: background=true requires store to be true"
            " (or left out).",
            param="background",
            code="unsupported_parameter",
        )
    if request.max_tool_calls is not None:
        require(request.max_tool_calls >= 1, "max_tool_calls", "max_tool_calls must be at least 1")
    if request.stream_options is not None:
        require(
            bool(request.stream),
            "stream_options",
            "stream_options is only allowed when stream is true",
        )
    if request.top_logprobs is not None:
        require(
            0 <= request.top_logprobs <= 20, "top_logprobs", "top_logprobs must be between 0 and 20"
        )
        require(
            LOGPROBS_INCLUDE in (request.include or []),
            "top_logprobs",
            f"top_logprobs needs include: ['{LOGPROBS_INCLUDE}']",
        )
    check_metadata(request.metadata)
    return request


@attrs.frozen
class PreparedResponse:
    request: ResponsesRequest
    prepared: Prepared
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    """Previous conversation plus this turn's input, as chat messages (stored whole, even
    when `truncation: "auto"` left its oldest messages out of this prompt)."""
    truncated_messages: int = 0
    """Messages `truncation: "auto"` left out of the prompt (the x-truncated-messages header)."""
    id: str = attrs.field(factory=lambda: item_id("resp"))
    created_at: int = attrs.field(factory=lambda: int(time.time()))
    reasoning_effort: str | None = None
    """The `reasoning.effort` a thinking model acted on (echoed in the response)."""

    @property
    def store(self) -> bool:
        return self.request.store is not False

    @property
    def background(self) -> bool:
        """Run apart from the request that made it (`serving/_background.py`)."""
        return self.request.background is True


def prepare_response(
    request: ResponsesRequest, served: ServedModel, previous: list[dict[str, Any]] | None
) -> PreparedResponse:
    served.check(request.model)
    ignored = _ignored_hints(request, served)
    effort = _effort(request, served)
    thinking = thinking_switch(served.thinking, effort, "reasoning.effort")
    items = input_items(request.input)
    turn, sources = messages_and_origins(items, thinking=served.thinking is not None)
    conversation = [*(previous or []), *turn]
    limit = served.caps.max_messages
    if len(conversation) > limit:
        raise InvalidRequest(
            f"the conversation holds {len(conversation)} messages; this server takes at most"
            f" {limit} (--max-messages)",
            param="previous_response_id" if previous else "input",
            code="conversation_too_long",
        )
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    messages = [structure(m, ChatMessage) for m in system + conversation]
    fields = SamplingFields(
        model=request.model,
        stream=request.stream,
        temperature=request.temperature,
        top_p=request.top_p,
        user=request.user,
        priority=request.priority,
    )
    checked = common(fields, served, request.service_tier)
    tools, forced = offered_tools(request.tools, _tool_choice(request), served)
    dropped = 0
    if request.truncation == "auto":
        messages, dropped = _truncated(
            served, messages, len(system), tools, request.max_output_tokens
        )
    check_prompt_size(served, prompt_texts(messages, tools), "input")
    origins = [
        *(["instructions"] * len(system)),
        *(["previous_response_id"] * len(previous or [])),
        *(f"input[{k}]" for k in sources),
    ]

    def where(index: int) -> str:  # a message of the (possibly truncated) prompt -> the request
        return origins[index if index < len(system) else index + dropped]

    tokens, images = render_served(
        served, messages, tools, where=where, url_param="image_url", thinking=thinking
    )
    prepared = prepared_for(  # rendered by `ResponseBuilder`
        RESPONSES_WIRE,
        fields,
        served,
        tokens,
        request.max_output_tokens,
        "max_output_tokens",
        checked,
        cache_key=request.prompt_cache_key,
        images=images,
        user_text=lambda: last_user_text(messages),
    )
    prepared = with_reasoning(prepared, served)
    prepared = with_response_format(
        prepared,
        served,
        request.text.format if request.text is not None else None,
        "text.format",
        forced_call=forced is not None,
    )
    prepared = with_processors(prepared, answer_only(prepared, served, forced))
    if LOGPROBS_INCLUDE in (request.include or []):
        if tools:
            raise InvalidRequest(
                "logprobs together with tools are not supported",
                param="include",
                code="unsupported_parameter",
            )
        prepared = with_logprobs(prepared, served, request.top_logprobs or 0)
    prepared = attrs.evolve(prepared, ignored=ignored)
    prepared = with_tools(
        prepared,
        served,
        tools,
        parallel=request.parallel_tool_calls is not False,
        max_calls=request.max_tool_calls,
    )
    return PreparedResponse(
        request,
        prepared,
        items,
        conversation,
        truncated_messages=dropped,
        reasoning_effort=effort if thinking is not None else None,
    )


def _effort(request: ResponsesRequest, served: ServedModel) -> str | None:
    """`reasoning.effort`, for a model that can act on it (a string, or a 400)."""
    effort = (request.reasoning or {}).get("effort")
    if not switchable(served.thinking) or effort is None:
        return None
    if not isinstance(effort, str):
        raise InvalidRequest(
            "Invalid type for 'reasoning.effort': expected a string",
            param="reasoning.effort",
            code="invalid_type",
        )
    return effort


def _ignored_hints(request: ResponsesRequest, served: ServedModel) -> tuple[str, ...]:
    """Chat's rule (`_params.ignored_hints`) for the Responses fields, nested ones included.
    A thinking model acts on `reasoning.effort`; the rest of `reasoning` (a summary: none
    is made) is named by its own path."""
    thinks = switchable(served.thinking)
    ignored = ignored_hints(
        request, _THINKING_HINTS if thinks else _HINTS, strict=served.strict_params
    )
    details = [
        part.detail
        for item in (request.input if isinstance(request.input, list) else [])
        if isinstance(item, MessageItem) and isinstance(item.content, list)
        for part in item.content
        if isinstance(part, ImagePart)
    ]
    nested = {
        "text.verbosity": request.text.verbosity if request.text else None,
        "stream_options.include_obfuscation": (
            request.stream_options.include_obfuscation if request.stream_options else None
        ),
        # The model's image processor decides each image's resolution.
        "input_image.detail": next((d for d in details if d not in (None, "auto")), None),
    }
    if thinks:
        nested.update(
            {f"reasoning.{k}": v for k, v in (request.reasoning or {}).items() if k != "effort"}
        )
    given = {name: value for name, value in nested.items() if value not in (None, False)}
    return (*ignored, *ignored_values(given, strict=served.strict_params))


def _truncated(
    served: ServedModel,
    messages: list[ChatMessage],
    keep: int,
    tools: list[dict[str, Any]],
    max_output_tokens: int | None,
) -> tuple[list[ChatMessage], int]:
    """`truncation: "auto"`: leave out the oldest turns until the prompt and the output budget
    fit the context, as OpenAI does. The first `keep` messages (the instructions) stay, and
    the last turn always does; a turn starts at a user message (templates that insist on
    alternating roles want the rest to start there, and no tool result is left without its
    call), or at any other message but a tool result when there is no user message left.
    A cut the template still refuses counts as not fitting. Still too long: the usual 400."""
    needed = max_output_tokens or 1
    starts = [i for i in range(keep, len(messages)) if messages[i].role == "user"] or [
        i for i in range(keep, len(messages)) if messages[i].role != "tool"
    ]

    def fits(drop: int) -> bool:
        checkpoint()  # each try renders the conversation again
        kept = messages[:keep] + messages[starts[drop] :]
        texts = sum(len(t.encode("utf-8")) for t in prompt_texts(kept, tools))
        if served.max_token_bytes and texts > served.context_length * served.max_token_bytes:
            return False  # certainly too long: no need to render it
        try:
            tokens, _ = render_served(served, kept, tools)
        except InvalidRequest:
            return False
        return served.room(len(tokens)) >= needed

    if len(starts) <= 1 or fits(0):
        return messages, 0
    low, high = 1, len(starts) - 1  # the fewest turns to drop: tokens fall as turns go
    if not fits(high):
        return messages[:keep] + messages[starts[high] :], starts[high] - keep
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return messages[:keep] + messages[starts[low] :], starts[low] - keep


def _tool_choice(request: ResponsesRequest) -> ToolChoiceMode | NamedToolChoice | None:
    """The Responses API's shapes only (`{"type": "function", "name"}`): the response echoes
    tool_choice, so chat's `{"function": {...}}` form would be echoed in a shape the
    Responses schema does not have. `{"type": "none" | "auto"}` is the bare string."""
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceType):
        return choice.type
    if isinstance(choice, NamedToolChoice) and choice.function is not None:
        raise InvalidRequest(
            "tool_choice names a function as {'type': 'function', 'name': ...}",
            param="tool_choice.function",
            code="invalid_value",
        )
    return choice
