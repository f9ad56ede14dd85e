"""What every generation request becomes: the plan `Prepared`, and the steps that build it.

Each API's adapter (`openai`'s chat, completions and Responses endpoints; `anthropic`'s
Messages) validates its request and builds a `Prepared` with the steps here: sampling and its
ranges, the context fit, tools, reasoning, structured outputs. The `Wire` it names says what
the plan needs of its endpoint; a `ChunkWire` (chat's, completions') also renders the body and
the stream's chunks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from ..engine import GenerationRequest, GrammarProcessor, ImageInputs, ThinkingGate
from . import _params as params
from ._errors import InvalidRequest
from ._generate import Finished
from ._logprobs import LogprobAligner, LogprobEntry
from ._reasoning import ReasoningSplitter, ThinkingFormat
from ._request_parts import ResponseFormat, SamplingFields, TextFormat, TextFormatParam, new_id, now
from ._served import ServedModel
from ._structured import response_format_processor
from ._tool_calls import ToolCallExtractor, ToolCallOut
from ._tools import ToolFormat

if TYPE_CHECKING:
    from ..engine import LogitsProcessor, SamplingParams, Usage


class Wire(Protocol):
    """What a plan needs of its endpoint, whoever renders the endpoint's objects."""

    @property
    def prompt_param(self) -> str:
        """The parameter a prompt-too-long error names."""

    @property
    def id_prefix(self) -> str: ...

    @property
    def trims_leading_space(self) -> bool:
        """A chat reply drops one leading space; a completion is the exact continuation."""


@attrs.frozen
class WireTraits:
    """A `Wire` whose objects its API renders itself (Messages: `anthropic`)."""

    prompt_param: str
    id_prefix: str
    trims_leading_space: bool


@runtime_checkable
class ChunkWire(Wire, Protocol):
    """One endpoint's objects on the wire: its non-streaming body and its stream's chunks
    (chat's, completions'), which `Prepared`'s rendering methods ask of it."""

    def body(
        self,
        p: Prepared,
        text: str,
        finished: Finished,
        calls: Sequence[ToolCallOut],
        logprobs: Sequence[LogprobEntry],
        reasoning: str | None,
    ) -> dict[str, Any]: ...

    def opening_chunks(self, p: Prepared) -> list[dict[str, Any]]: ...

    def reasoning_chunk(self, p: Prepared, text: str) -> dict[str, Any]: ...

    def delta_chunk(
        self, p: Prepared, text: str, logprobs: Sequence[LogprobEntry], offset: int
    ) -> dict[str, Any]: ...

    def tool_call_chunks(self, p: Prepared, call: ToolCallOut) -> list[dict[str, Any]]: ...

    def closing_chunks(self, p: Prepared, finished: Finished) -> list[dict[str, Any]]: ...


def _no_user_text() -> str:
    return ""


@attrs.frozen(slots=False)  # slots off: cached_property needs a __dict__
class Prepared:
    wire: Wire
    generation: GenerationRequest
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str
    id: str = attrs.field(factory=lambda: "")
    created: int = attrs.field(factory=now)
    tools: list[dict[str, Any]] = attrs.field(factory=list)
    """Offered to the model (empty: no tool parsing)."""
    tool_format: ToolFormat | None = None
    """The model's tool-call format (its markup and parser, from mlx-lm), or the fallback."""
    max_tool_calls: int | None = None
    """Generation stops after this many calls (1: parallel_tool_calls false); None: no cap."""
    token_text: Callable[[int], str] | None = None
    """Decodes one token id; set when logprobs were asked for."""
    token_bytes: Callable[[int], bytes] | None = None
    """A token id's exact bytes; set when logprobs were asked for."""
    ignored: tuple[str, ...] = ()
    usage: Callable[[Usage], Usage] | None = None
    """Rewrites the usage reported (an extension's, e.g. the scripted model's); None: the
    real counts."""
    drop_on_failure: bool = False
    """A failure of this stream drops its connection (`ConnectionDropped`) instead of ending
    it with an error event (an extension's, e.g. the scripted model's `drop_after`)."""
    user_text: Callable[[], str] = _no_user_text
    """The text of the request's last user turn (completions: the prompt), when asked: for
    an extension that answers with it (the scripted model's echo)."""
    thinking: ThinkingFormat | None = None
    """A thinking model's markers: its reasoning is split from its answer (None: no split)."""
    thinking_opened: bool = False
    """The prompt opened the think block: the output begins mid-thought."""
    service_tier: str | None = None
    """The OpenAI service tier the request was served at, echoed in its response (None: it
    sent none)."""
    calls_only: bool = False
    """The answer is a tool call by construction (tool_choice "required" or a named
    function): a stream opens without content (OpenAI's `content: null`), not with text."""

    def logprob_aligner(self) -> LogprobAligner | None:
        if self.token_text is None:
            return None
        return LogprobAligner(
            self.token_text, self.token_bytes, trimmed_space=self.generation.trim_leading_space
        )

    def reasoning_splitter(self) -> ReasoningSplitter | None:
        if self.thinking is None:
            return None
        return ReasoningSplitter(self.thinking, opened=self.thinking_opened)

    def tool_extractor(self) -> ToolCallExtractor | None:
        if not self.tools or self.tool_format is None:
            return None
        return ToolCallExtractor(self.tool_format, self.tools, max_calls=self.max_tool_calls)

    @property
    def prompt_param(self) -> str:
        return self.wire.prompt_param

    @functools.cached_property
    def _chunks(self) -> ChunkWire:
        """The wire as a renderer of chunks; a TypeError for one that renders none."""
        if not isinstance(self.wire, ChunkWire):
            raise TypeError(f"{type(self.wire).__name__} renders no body or chunks")
        return self.wire

    # -- the wire objects, as the endpoint's `Wire` renders them ------------------------------
    def body(
        self,
        text: str,
        finished: Finished,
        calls: Sequence[ToolCallOut] = (),
        logprobs: Sequence[LogprobEntry] = (),
        reasoning: str | None = None,
    ) -> dict[str, Any]:
        """`reasoning`: a thinking model's (None for a model that does not think)."""
        return self._chunks.body(self, text, finished, calls, logprobs, reasoning)

    def opening_chunks(self) -> list[dict[str, Any]]:
        return self._chunks.opening_chunks(self)

    def reasoning_chunk(self, text: str) -> dict[str, Any]:
        return self._chunks.reasoning_chunk(self, text)

    def delta_chunk(
        self, text: str, logprobs: Sequence[LogprobEntry] = (), offset: int = 0
    ) -> dict[str, Any]:
        """A chunk of content; `offset` is where it starts in the content (for text_offset)."""
        return self._chunks.delta_chunk(self, text, logprobs, offset)

    def tool_call_chunks(self, call: ToolCallOut) -> list[dict[str, Any]]:
        return self._chunks.tool_call_chunks(self, call)

    def closing_chunks(self, finished: Finished) -> list[dict[str, Any]]:
        return self._chunks.closing_chunks(self, finished)

    def delta_json(self, text: str) -> str:
        """`delta_chunk(text)` as JSON, from a template: the hot path runs once per token per
        stream, and only the text varies between its chunks."""
        head, tail = self._delta_template
        return head + _json_string(text) + tail

    @functools.cached_property
    def _delta_template(self) -> tuple[str, str]:
        marker = "\x00delta\x00"
        whole = json.dumps(self.delta_chunk(marker), ensure_ascii=False, separators=(",", ":"))
        head, tail = whole.split(json.dumps(marker, ensure_ascii=False))
        return head, tail


_json_string = json.JSONEncoder(ensure_ascii=False).encode
"""A string as JSON, as `json.dumps(text, ensure_ascii=False)` writes it, without building
an encoder per call (`dumps` does, given any option)."""


# -- the steps every endpoint builds a `Prepared` with ------------------------------------------
@attrs.frozen
class Common:
    """The sampling and streaming fields chat, completions and Responses share, checked."""

    sampling: SamplingParams
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    priority: int = 0
    service_tier: str | None = None
    """The tier to echo (`_params.request_priority`)."""


def common(request: SamplingFields, served: ServedModel, service_tier: str | None = None) -> Common:
    """`service_tier`: OpenAI's, where the API has one (chat, Responses)."""
    params.check_n(request.n)
    priority, tier = params.request_priority(request.priority, service_tier)
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
    return Common(
        sampling,
        params.stop_strings(request.stop),
        stream,
        bool(options and options.include_usage),
        priority,
        tier,
    )


def prepared_for(
    wire: Wire,
    request: SamplingFields,
    served: ServedModel,
    tokens: list[int],
    budget: int | None,
    budget_param: str,
    checked: Common,
    cache_key: str | None = None,
    images: ImageInputs | None = None,
    user_text: Callable[[], str] | None = None,
) -> Prepared:
    """The engine request for a rendered prompt: its token budget checked against the room
    the context leaves. `user_text`: the request's last user turn (`Prepared.user_text`)."""
    room = served.room(len(tokens))
    max_tokens = params.max_tokens(
        budget, budget_param, served.default_max_tokens, room, served.caps.max_tokens
    )
    generation = GenerationRequest(
        tokens,
        max_tokens,
        sampling=checked.sampling,
        cache_key=cache_key,
        trim_leading_space=wire.trims_leading_space,
        images=images,
        priority=checked.priority,
        adapter=served.adapter_for(request.model),
    )
    return Prepared(
        wire,
        generation,
        checked.stops,
        checked.stream,
        checked.include_usage,
        request.model,
        id=new_id(wire.id_prefix),
        user_text=user_text or _no_user_text,
        service_tier=checked.service_tier,
    )


def with_reasoning(prepared: Prepared, served: ServedModel) -> Prepared:
    """Split a thinking model's reasoning from its answer, knowing from the rendered prompt
    whether the output begins mid-thought."""
    if served.thinking is None:
        return prepared
    opened = served.thinking.opened_by(prepared.generation.prompt_tokens)
    return attrs.evolve(prepared, thinking=served.thinking, thinking_opened=opened)


def answer_only(
    prepared: Prepared, served: ServedModel, processor: LogitsProcessor | None
) -> LogitsProcessor | None:
    """A grammar processor (a format, a forced or strict call) for a thinking model's answer:
    gated so that the thinking runs free and the grammar starts after it (`ThinkingGate`).
    Other processors, and any for a model that does not think, are returned as they are.
    Markers of several tokens cannot be gated: a 400 naming the grammar's field."""
    form = prepared.thinking
    if form is None or not isinstance(processor, GrammarProcessor):
        return processor
    if len(form.start_ids) != 1 or len(form.end_ids) != 1:
        raise InvalidRequest(
            "this model's thinking markers are several tokens each: its answer cannot be "
            "held to a grammar after its thinking",
            param=processor.param,
            code="unsupported_parameter",
        )
    eos = frozenset(getattr(served.tokenizer, "eos_token_ids", ()) or ())
    return ThinkingGate(
        processor, form.start_ids[0], form.end_ids[0], eos, opened=prepared.thinking_opened
    )


def with_processors(prepared: Prepared, *processors: LogitsProcessor | None) -> Prepared:
    """Add logits processors to the request (None entries are skipped)."""
    added = tuple(p for p in processors if p is not None)
    if not added:
        return prepared
    chained = (*prepared.generation.logits_processors, *added)
    generation = attrs.evolve(prepared.generation, logits_processors=chained)
    return attrs.evolve(prepared, generation=generation)


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
    limit = 1 if not parallel else None
    if max_calls is not None:
        limit = min(limit or max_calls, max_calls)
    return attrs.evolve(prepared, tools=tools, tool_format=served.tool_format, max_tool_calls=limit)


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
    if forced_call or processor is None:
        return prepared
    return with_processors(prepared, answer_only(prepared, served, processor))
