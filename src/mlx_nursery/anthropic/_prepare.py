"""A Messages request checked and rendered into the engine request every API builds
(`generation.Prepared`), with the steps chat and Responses use: sampling, tools and
tool_choice (enforced by constrained decoding), output format.

What is Anthropic's own: its fields and their ranges, its tool and tool_choice shapes, its
conversation of content blocks (`_conversation`), prefill, and the `msg_` id. The engine
side sees what a chat request would give it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs

from ..generation import (
    FunctionTool,
    InvalidRequest,
    NamedToolChoice,
    Prepared,
    SamplingFields,
    ServedModel,
    TextJsonSchemaFormat,
    WireTraits,
    answer_only,
    check_between,
    check_count,
    check_prompt_size,
    common,
    ignored_hints,
    ignored_values,
    image_taker,
    offered_tools,
    prepared_for,
    reject_unimplemented,
    render_served_template,
    structure,
    thinking_on,
    with_processors,
    with_reasoning,
    with_response_format,
    with_tools,
)
from ._conversation import conversation_texts, template_messages
from ._schemas import (
    ConversationFields,
    CountTokensRequest,
    MessagesRequest,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
)

if TYPE_CHECKING:
    from ..engine import GrammarProcessor, ImageInputs

MESSAGES_WIRE = WireTraits(prompt_param="messages", id_prefix="msg", trims_leading_space=True)
"""What a Messages plan needs of its wire; its objects are rendered by `_output`."""
MAX_STOP_SEQUENCES = 16
"""Stop strings are matched on every piece of text generated: a bound keeps that cheap."""
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
_UNIMPLEMENTED: dict[str, object] = {"container": (), "diagnostics": (), "inference_geo": ()}
_HINTS: dict[str, object] = {
    "cache_control": (),
    "service_tier": ("auto", "standard_only"),
    "user_profile_id": (),
    "workspace_id": (),
    "context_management": (),  # no server-side context editing: a long context is refused
}


@attrs.frozen
class Rendered:
    """A conversation rendered: its prompt, the tools shown, what tool_choice forces."""

    tokens: list[int]
    images: ImageInputs | None
    tools: list[dict[str, Any]]
    forced: GrammarProcessor | None
    prefill: bool
    ignored: tuple[str, ...]


def parse_messages_request(body: Any) -> MessagesRequest:
    return structure(body, MessagesRequest)


def prepare_messages(request: MessagesRequest, served: ServedModel) -> Prepared:
    """The engine request for a Messages request. Raises InvalidRequest (400) naming the
    field for anything it does not take. Tokenizes and decodes images: a worker thread."""
    served.check(request.model)
    reject_unimplemented(request, _UNIMPLEMENTED)
    check_between(request.temperature, 0.0, 1.0, "temperature")  # Anthropic's range
    fields = SamplingFields(
        model=request.model,
        stream=request.stream,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        user=request.metadata.user_id if request.metadata is not None else None,
        priority=request.priority,
    )
    checked = attrs.evolve(common(fields, served), stops=_stop_sequences(request.stop_sequences))
    rendered = _render(request, served)
    prepared = prepared_for(
        MESSAGES_WIRE, fields, served, rendered.tokens, request.max_tokens, "max_tokens", checked,
        images=rendered.images, user_text=lambda: _last_user_text(request),
    )  # fmt: skip
    prepared = with_reasoning(prepared, served)  # thinking blocks apart from the text
    # A stream's message_start states the prompt's usage as its end does: the engine tells
    # it on admission, once the prefix cache's read is known.
    generation = attrs.evolve(prepared.generation, report_admission=bool(request.stream))
    if rendered.prefill:  # the reply continues the assistant's text exactly
        generation = attrs.evolve(generation, trim_leading_space=False)
    prepared = attrs.evolve(
        prepared, id=f"msg_{prepared.id.partition('-')[2]}", generation=generation
    )
    output_format = request.output_config.format if request.output_config else None
    if rendered.prefill and output_format is not None:
        raise InvalidRequest(  # the grammar would hold the continuation, not the whole text
            "a prefilled assistant message cannot be continued under output_config.format",
            param="output_config.format",
            code="invalid_value",
        )
    prepared = with_response_format(
        prepared,
        served,
        TextJsonSchemaFormat("output", output_format.schema) if output_format else None,
        "output_config.format",
        forced_call=rendered.forced is not None,
    )
    prepared = with_processors(prepared, answer_only(prepared, served, rendered.forced))
    prepared = attrs.evolve(prepared, ignored=(*rendered.ignored, *_ignored(request, served)))
    choice = request.tool_choice
    single = (
        not isinstance(choice, ToolChoiceNone)
        and choice is not None
        and choice.disable_parallel_tool_use is True
    )
    return with_tools(prepared, served, rendered.tools, parallel=not single)


def parse_count_request(body: Any) -> CountTokensRequest:
    return structure(body, CountTokensRequest)


def count_tokens(request: CountTokensRequest, served: ServedModel) -> dict[str, int]:
    """`/v1/messages/count_tokens`: the prompt's tokens as a message request would have
    them (system, messages, tools). Tokenizes: a worker thread."""
    served.check(request.model)
    return {"input_tokens": len(_render(request, served).tokens)}


THINKING_TYPES = ("enabled", "adaptive", "disabled")


def thinking_switch(
    request: ConversationFields, served: ServedModel
) -> tuple[bool | None, tuple[str, ...]]:
    """The template's `enable_thinking` for `thinking` (None: its default), and what of it
    the server does not act on (named in x-ignored-params; a 400 with --strict-params):
    thinking asked of a model that cannot do as asked (no thinking, or a template without
    the switch), and `budget_tokens` (thinking ends where the model ends it)."""
    thinking = request.thinking
    if thinking is None:
        return None, ()
    if thinking.type not in THINKING_TYPES:
        raise InvalidRequest(
            f"thinking.type must be one of {', '.join(THINKING_TYPES)}, got {thinking.type!r}",
            param="thinking.type",
            code="invalid_value",
        )
    on = thinking.type != "disabled"
    switch = thinking_on(served.thinking, on)
    given: dict[str, object] = {}
    thinks_anyway = served.thinking is not None  # a template without the switch thinks
    if switch is None and on != thinks_anyway:
        given["thinking.type"] = thinking.type
    if on and thinking.budget_tokens is not None:
        given["thinking.budget_tokens"] = thinking.budget_tokens
    return switch, ignored_values(given, strict=served.strict_params)


def _render(request: ConversationFields, served: ServedModel) -> Rendered:
    check_count(len(request.messages), served.caps.max_messages, "messages")
    thinking, thinking_ignored = thinking_switch(request, served)
    for i, tool in enumerate(request.tools or ()):
        _check_tool(tool, f"tools[{i}]")
    raw = [
        FunctionTool(
            name=tool.name,
            description=tool.description,
            parameters=tool.input_schema,
            strict=tool.strict,
        )
        for tool in request.tools or ()
    ]
    tools, forced = offered_tools(raw, _tool_choice(request), served)
    check_prompt_size(served, conversation_texts(request), "messages")
    images = image_taker(served)
    messages, prefill = template_messages(request, images)
    tokens, inputs = render_served_template(
        served, messages, tools, images, continue_final=prefill, thinking=thinking
    )
    if prefill and forced is not None:
        raise InvalidRequest(
            "a prefilled assistant message cannot be continued with a forced tool call",
            param="tool_choice",
            code="invalid_value",
        )
    hints = {f"tools[{i}].eager_input_streaming": t.eager_input_streaming for i, t in enumerate(
        request.tools or ())}  # fmt: skip
    given = {k: v for k, v in hints.items() if v is not None}
    ignored = (*thinking_ignored, *ignored_values(given, strict=served.strict_params))
    return Rendered(tokens, inputs, tools, forced, prefill, ignored)


def _tool_choice(request: ConversationFields) -> Any:
    """Anthropic's tool_choice as the shared rule takes it: "any" is chat's "required"."""
    choice = request.tool_choice
    if choice is None or choice.type == "auto":
        return None
    if isinstance(choice, ToolChoiceAny):
        return "required"
    if isinstance(choice, ToolChoiceTool):
        return NamedToolChoice(name=choice.name)
    return "none"


def _check_tool(tool: Any, where: str) -> None:
    if not _TOOL_NAME.fullmatch(tool.name):
        raise InvalidRequest(
            "a tool name is 1-128 letters, digits, '_' or '-'",
            param=f"{where}.name",
            code="invalid_value",
        )
    if tool.input_schema.get("type") != "object":
        raise InvalidRequest(
            "input_schema must be a JSON schema of type 'object'",
            param=f"{where}.input_schema.type",
            code="invalid_value",
        )
    if tool.input_examples:
        raise InvalidRequest(
            "input_examples are not supported", param=f"{where}.input_examples",
            code="unsupported_parameter",
        )  # fmt: skip
    if tool.defer_loading:
        raise InvalidRequest(
            "defer_loading needs tool search, which this server does not run",
            param=f"{where}.defer_loading",
            code="unsupported_parameter",
        )


def _stop_sequences(stops: list[str] | None) -> tuple[str, ...]:
    stops = stops or []
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(
            f"stop_sequences takes at most {MAX_STOP_SEQUENCES} strings",
            param="stop_sequences",
            code="invalid_value",
        )
    for i, stop in enumerate(stops):
        if not stop:
            raise InvalidRequest(
                "stop sequences must not be empty",
                param=f"stop_sequences[{i}]",
                code="invalid_value",
            )
    return tuple(stops)


def _ignored(request: MessagesRequest, served: ServedModel) -> tuple[str, ...]:
    """Hints that change nothing here (as chat's: named in x-ignored-params, a 400 with
    --strict-params): cache breakpoints (the prefix cache needs none) and an effort."""
    ignored = ignored_hints(request, _HINTS, strict=served.strict_params)
    given: dict[str, object] = {}
    effort = request.output_config.effort if request.output_config else None
    if effort is not None:
        given["output_config.effort"] = effort
    if "cache_control" not in ignored and any(_block_breakpoints(request)):
        given["cache_control"] = "a block's breakpoint"
    return (*ignored, *ignored_values(given, strict=served.strict_params))


def _block_breakpoints(request: ConversationFields) -> Iterator[bool]:
    """Whether each block and tool carries a cache breakpoint."""
    yield from (t.cache_control is not None for t in request.tools or ())
    if isinstance(request.system, list):
        yield from (b.cache_control is not None for b in request.system)
    for message in request.messages:
        if isinstance(message.content, list):
            # thinking blocks carry no breakpoint
            yield from (getattr(b, "cache_control", None) is not None for b in message.content)


def _last_user_text(request: MessagesRequest) -> str:
    """The last user message's text (`Prepared.user_text`)."""
    for message in reversed(request.messages):
        if message.role != "user":
            continue
        if isinstance(message.content, str):
            return message.content
        return "".join(getattr(block, "text", "") for block in message.content)
    return ""
