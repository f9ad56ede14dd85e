"""Chat and text completions: wire request -> engine request, engine output -> wire objects.

`prepare_chat` / `prepare_completion` validate and tokenize (raising
`OpenAIError`s that name the parameter); the returned `Prepared` renders the
non-streaming body and the stream's chunks for its endpoint.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, Literal

import attrs

from ..engine import GenerationRequest
from . import _params as params
from ._chat import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChunkChoice,
    FunctionCall,
    ResponseFormat,
    ToolCall,
)
from ._completions import Completion, CompletionChoice, CompletionRequest
from ._converter import structure, to_json
from ._errors import InvalidRequest, quoted
from ._generation import Finished
from ._logprobs import LogprobAligner, LogprobEntry
from ._prompts import check_prompt_size, completion_tokens, prompt_texts, render_chat
from ._responses_schemas import TextFormatParam
from ._served import ServedModel
from ._shared import FunctionTool, NamedToolChoice, SamplingFields, TextFormat, ToolChoiceMode
from ._structured import response_format_processor
from ._tools import ToolCallExtractor, ToolCallOut, normalize_tools, strict_tool_names
from ._usage import UsageOut, new_id, now

Kind = Literal["chat", "completion"]

_CHAT_UNIMPLEMENTED: dict[str, object] = {
    # field: its no-op value(s); anything else is a 400 naming the field
    "functions": ([],),
    "function_call": "none",
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "service_tier": ("auto", "default"),
}
_CHAT_HINTS: dict[str, object] = {
    # field: its no-op value(s); anything else is accepted, ignored and named (or a 400, strict)
    "reasoning_effort": (),  # no model served here reasons
    "verbosity": (),
    "prompt_cache_retention": (),  # the prefix cache keeps what its budget allows
    "store": False,  # no stored chat completions here
    "metadata": ({},),  # kept only with stored completions
}
_COMPLETION_UNIMPLEMENTED: dict[str, object] = {
    "echo": False,
    "suffix": (),
    "best_of": 1,
}


@attrs.frozen(slots=False)  # slots off: cached_property needs a __dict__
class Prepared:
    kind: Kind
    generation: GenerationRequest
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str
    id: str = attrs.field(factory=lambda: "")
    created: int = attrs.field(factory=now)
    tools: list[dict[str, Any]] = attrs.field(factory=list)
    """Offered to the model (empty: no tool parsing)."""
    tool_markup: tuple[str, str, Any] | None = None
    """(start, end, parse) of the model's tool-call format, from mlx-lm."""
    max_tool_calls: int | None = None
    """Generation stops after this many calls (1: parallel_tool_calls false); None: no cap."""
    token_text: Any = None
    """Decodes one token id; set when logprobs were asked for."""
    token_bytes: Any = None
    """A token id's exact bytes; set when logprobs were asked for."""
    ignored: tuple[str, ...] = ()
    """Hints the request set that this server does not act on (`x-ignored-params`)."""

    def logprob_aligner(self) -> LogprobAligner | None:
        if self.token_text is None:
            return None
        return LogprobAligner(
            self.token_text, self.token_bytes, trimmed_space=self.generation.trim_leading_space
        )

    def tool_extractor(self) -> ToolCallExtractor | None:
        if not self.tools or self.tool_markup is None:
            return None
        start, end, parse = self.tool_markup
        return ToolCallExtractor(start, end, parse, self.tools, max_calls=self.max_tool_calls)

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"

    # -- non-streaming ----------------------------------------------------------------------
    def body(
        self,
        text: str,
        finished: Finished,
        calls: Sequence[ToolCallOut] = (),
        logprobs: Sequence[LogprobEntry] = (),
    ) -> dict[str, Any]:
        usage = UsageOut.of(finished.usage)
        if self.kind == "chat":
            message = AssistantMessage(
                text if text or not calls else None,
                tool_calls=[ToolCall(c.id, FunctionCall(c.name, c.arguments)) for c in calls]
                or None,
            )
            choice = ChatChoice(0, message, finished.reason, self._logprobs(logprobs, 0))
            body: dict[str, Any] = to_json(
                ChatCompletion(self.id, self.created, self.model, [choice], usage)
            )
            return body
        text_choice = CompletionChoice(0, text, finished.reason, self._logprobs(logprobs, 0))
        body = to_json(Completion(self.id, self.created, self.model, [text_choice], usage))
        return body

    def _logprobs(self, entries: Sequence[LogprobEntry], offset: int) -> dict[str, Any] | None:
        if self.token_text is None:
            return None
        if self.kind == "chat":
            return {"content": [e.chat() for e in entries], "refusal": None}
        offsets, position = [], offset
        for entry in entries:
            offsets.append(position)
            position += len(entry.token)
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t: lp for t, lp, _ in e.top} for e in entries],
            "text_offset": offsets,
        }

    # -- streaming --------------------------------------------------------------------------
    def opening_chunks(self) -> list[dict[str, Any]]:
        if self.kind == "chat":
            return [self._chat_chunk(ChatDelta(role="assistant", content=""))]
        return []

    def delta_chunk(
        self, text: str, logprobs: Sequence[LogprobEntry] = (), offset: int = 0
    ) -> dict[str, Any]:
        """A chunk of content; `offset` is where it starts in the content (for text_offset)."""
        if self.kind == "chat":
            return self._chat_chunk(
                ChatDelta(content=text), logprobs=self._logprobs(logprobs, offset)
            )
        return self._completion_chunk(text, None, self._logprobs(logprobs, offset))

    def tool_call_chunks(self, call: ToolCallOut) -> list[dict[str, Any]]:
        """OpenAI's shape: the first fragment names the call, the next carries its arguments."""
        opening = {
            "index": call.index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        arguments = {"index": call.index, "function": {"arguments": call.arguments}}
        return [
            self._chat_chunk(ChatDelta(tool_calls=[opening])),
            self._chat_chunk(ChatDelta(tool_calls=[arguments])),
        ]

    def delta_json(self, text: str) -> str:
        """`delta_chunk(text)` as JSON, from a template: the hot path runs once per token per
        stream, and only the text varies between its chunks."""
        head, tail = self._delta_template
        return head + json.dumps(text, ensure_ascii=False) + tail

    @functools.cached_property
    def _delta_template(self) -> tuple[str, str]:
        marker = "\x00delta\x00"
        whole = json.dumps(self.delta_chunk(marker), ensure_ascii=False, separators=(",", ":"))
        head, tail = whole.split(json.dumps(marker, ensure_ascii=False))
        return head, tail

    def closing_chunks(self, finished: Finished) -> list[dict[str, Any]]:
        if self.kind == "chat":
            chunks = [self._chat_chunk(ChatDelta(), finished.reason)]
        else:
            chunks = [self._completion_chunk("", finished.reason)]
        if self.include_usage:
            usage = UsageOut.of(finished.usage)
            if self.kind == "chat":
                chunk: Any = ChatCompletionChunk(self.id, self.created, self.model, [], usage)
            else:
                chunk = Completion(self.id, self.created, self.model, [], usage)
            chunks.append(to_json(chunk))
        return chunks

    def _chat_chunk(
        self,
        delta: ChatDelta,
        finish_reason: str | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        choice = ChunkChoice(0, delta, finish_reason, logprobs)
        chunk: dict[str, Any] = to_json(
            ChatCompletionChunk(self.id, self.created, self.model, [choice])
        )
        # OpenAI sends `usage: null` on every chunk only when usage was asked for.
        if not self.include_usage:
            del chunk["usage"]
        return chunk

    def _completion_chunk(
        self, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        chunk: dict[str, Any] = to_json(
            Completion(
                self.id,
                self.created,
                self.model,
                [CompletionChoice(0, text, finish_reason, logprobs)],
            )
        )
        if not self.include_usage:
            del chunk["usage"]
        return chunk


def prepare_chat(body: Any, served: ServedModel) -> Prepared:
    request = structure(body, ChatCompletionRequest)
    served.check(request.model)
    params.reject_unimplemented(request, _CHAT_UNIMPLEMENTED)
    ignored = params.ignored_hints(request, _CHAT_HINTS, strict=served.strict_params)
    if request.max_tokens is not None and request.max_completion_tokens is not None:
        params.require(
            request.max_tokens == request.max_completion_tokens,
            "max_completion_tokens",
            "max_tokens and max_completion_tokens disagree; set only one",
        )
    budget, budget_param = (
        (request.max_completion_tokens, "max_completion_tokens")
        if request.max_completion_tokens is not None
        else (request.max_tokens, "max_tokens")
    )
    common = _common(request, served)
    tools, forced = _offered_tools(request.tools, request.tool_choice, served)
    check_prompt_size(served, prompt_texts(request.messages, tools), "messages")
    tokens = render_chat(
        served.tokenizer, request.messages, tools, native_tools=served.tool_format.native
    )
    prepared = _prepare(
        "chat",
        request,
        served,
        tokens,
        budget,
        budget_param,
        common,
        cache_key=request.prompt_cache_key,
    )
    prepared = with_response_format(
        prepared, served, request.response_format, "response_format", forced_call=forced is not None
    )
    prepared = with_processors(prepared, forced)
    prepared = with_logprobs(prepared, served, _chat_logprobs(request, bool(tools)))
    prepared = attrs.evolve(prepared, ignored=ignored)
    return with_tools(prepared, served, tools, parallel=request.parallel_tool_calls is not False)


def with_tools(
    prepared: Prepared,
    served: ServedModel,
    tools: list[dict[str, Any]],
    *,
    parallel: bool,
    max_calls: int | None = None,
) -> Prepared:
    """Parse the model's output for calls of `tools`, in its own tool-call format; stop after
    one call when not `parallel`, after `max_calls` in any case."""
    if not tools:
        return prepared
    form = served.tool_format
    limit = 1 if not parallel else None
    if max_calls is not None:
        limit = min(limit or max_calls, max_calls)
    return attrs.evolve(
        prepared, tools=tools, tool_markup=(form.start, form.end, form.parse), max_tool_calls=limit
    )


def _offered_tools(
    raw: list[FunctionTool] | None,
    choice: ToolChoiceMode | NamedToolChoice | None,
    served: ServedModel,
) -> tuple[list[dict[str, Any]], Any]:
    """The tools the model is shown, and the constraint on its calls (or None).

    tool_choice: "none" shows no tools; "auto" (default) lets the model choose; "required" and
    a named function force exactly one call by constrained decoding, with arguments valid
    against the tool's parameters. Under "auto", `strict: true` tools are enforced lazily:
    free text until the model opens a call, then a call whose arguments follow the schema
    (`Grammars.strict_tools_processor`). Constraints need a JSON call format (the model's own,
    or the fallback convention). A tool_choice is checked with or without tools: one that
    forces a call needs a tool to call.
    """
    tools = normalize_tools(raw)
    forcing = choice not in (None, "auto", "none")
    name = _forced_name(choice, tools) if isinstance(choice, NamedToolChoice) else None
    if forcing and not tools:
        raise InvalidRequest(
            "tool_choice 'required' needs tools to call", param="tool_choice", code="invalid_value"
        )
    if choice == "none" or not tools:
        return [], None
    form = served.tool_format
    markup = (form.start, form.end)
    strict = strict_tool_names(raw)
    if not forcing and not strict:
        return tools, None
    if not form.json or served.grammars is None:
        what = "tool_choice 'required' or a named function" if forcing else "strict tools"
        raise InvalidRequest(
            f"{what} can be enforced only for models with the <tool_call> JSON format",
            param="tool_choice" if forcing else "tools",
            code="unsupported_parameter",
        )
    if not forcing:
        return tools, served.grammars.strict_tools_processor(tools, strict, markup, "tools")
    return tools, served.grammars.tool_call_processor(tools, markup, "tool_choice", name=name)


def _forced_name(choice: NamedToolChoice, tools: list[dict[str, Any]]) -> str:
    """The function a tool_choice names: chat's `{"type": "function", "function": {"name"}}`
    or the Responses API's `{"type": "function", "name"}`."""
    name = choice.function.name if choice.function is not None else choice.name
    if name is None:
        raise InvalidRequest(
            "tool_choice must name a function", param="tool_choice", code="invalid_value"
        )
    if name in {t["function"]["name"] for t in tools}:
        return name
    raise InvalidRequest(
        f"tool_choice names {quoted(name)}, which is not among the tools",
        param="tool_choice",
        code="invalid_value",
    )


def with_processors(prepared: Prepared, *processors: Any) -> Prepared:
    """Add logits processors to the request (None entries are skipped)."""
    added = tuple(p for p in processors if p is not None)
    if not added:
        return prepared
    chained = (*prepared.generation.logits_processors, *added)
    generation = attrs.evolve(prepared.generation, logits_processors=chained)
    return attrs.evolve(prepared, generation=generation)


def prepare_completion(body: Any, served: ServedModel) -> Prepared:
    request = structure(body, CompletionRequest)
    served.check(request.model)
    params.reject_unimplemented(request, _COMPLETION_UNIMPLEMENTED)
    common = _common(request, served)
    tokens = completion_tokens(served, request)
    prepared = _prepare(
        "completion", request, served, tokens, request.max_tokens, "max_tokens", common
    )
    if request.logprobs is not None:
        params.require(0 <= request.logprobs <= 5, "logprobs", "logprobs must be between 0 and 5")
    return with_logprobs(prepared, served, request.logprobs)


def _chat_logprobs(request: ChatCompletionRequest, tools: bool) -> int | None:
    """Chat: `logprobs: true` turns them on; `top_logprobs` (0-20) adds alternatives."""
    if request.top_logprobs is not None:
        params.require(bool(request.logprobs), "top_logprobs", "top_logprobs needs logprobs: true")
        params.require(
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


def with_logprobs(prepared: Prepared, served: ServedModel, top: int | None) -> Prepared:
    """Ask the engine for logprobs (`top` alternatives each); None leaves them off."""
    if top is None:
        return prepared
    tokenizer = served.tokenizer
    generation = attrs.evolve(prepared.generation, logprobs=top)
    token_bytes = served.token_bytes or (lambda token: tokenizer.decode([token]).encode())
    return attrs.evolve(
        prepared,
        generation=generation,
        token_text=lambda token: tokenizer.decode([token]),
        token_bytes=token_bytes,
    )


@attrs.frozen
class _Common:
    sampling: Any
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool


def _common(request: SamplingFields, served: ServedModel) -> _Common:
    params.check_n(request.n)
    sampling = params.for_engine(params.sampling_from(request), served.vocab_size)
    params.validate_vocab(sampling.logit_bias, served.vocab_size)
    stream = bool(request.stream)
    options = request.stream_options
    if options is not None:
        params.require(
            stream, "stream_options", "stream_options is only allowed when stream is true"
        )
        if options.include_obfuscation:
            params.reject_unimplemented(options, {"include_obfuscation": False})
    return _Common(
        sampling, params.stop_strings(request.stop), stream, bool(options and options.include_usage)
    )


def _prepare(
    kind: Kind,
    request: SamplingFields,
    served: ServedModel,
    tokens: list[int],
    budget: int | None,
    budget_param: str,
    common: _Common,
    cache_key: str | None = None,
) -> Prepared:
    room = served.context_length - len(tokens)
    max_tokens = params.max_tokens(budget, budget_param, served.default_max_tokens, room)
    # A chat reply drops one leading space; a completion is the exact continuation of its prompt.
    generation = GenerationRequest(
        tokens,
        max_tokens,
        sampling=common.sampling,
        cache_key=cache_key,
        trim_leading_space=kind == "chat",
    )
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return Prepared(
        kind,
        generation,
        common.stops,
        common.stream,
        common.include_usage,
        request.model,
        id=new_id(prefix),
    )


def with_response_format(
    prepared: Prepared,
    served: ServedModel,
    response_format: ResponseFormat | TextFormatParam | None,
    param: str,
    *,
    forced_call: bool = False,
) -> Prepared:
    """Constrain decoding to `response_format` (a per-request logits processor).

    With a forced tool call (`forced_call`) the output is the call and no content, which the
    format holds for trivially: it is checked (a bad schema is still a 400) but not applied.
    Applied, its grammar would refuse the call's markup, leave no token allowed beside the
    call's grammar, and fail the generation."""
    if response_format is None or served.grammars is None:
        if response_format is not None and not isinstance(response_format, TextFormat):
            raise InvalidRequest(
                "structured outputs are not available for this model",
                param=param,
                code="unsupported_parameter",
            )
        return prepared
    processor = response_format_processor(served.grammars, response_format, param)
    return prepared if forced_call else with_processors(prepared, processor)
