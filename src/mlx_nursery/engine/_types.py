"""The engine's data: what goes in (GenerationRequest) and what comes out (TokenEvent).

Plain attrs classes, free of HTTP and OpenAI concepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
from attrs import validators as v

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

FinishReason = Literal["stop", "length", "cancelled", "error"]
LogitsProcessor = Callable[[Any, Any], Any]  # (tokens: mx.array, logits: mx.array) -> mx.array


class Tokenizer(Protocol):
    """What the server calls on a text model's tokenizer: mlx-lm's `TokenizerWrapper`, which
    forwards them to Hugging Face's tokenizer. A protocol because mypy does not follow mlx-lm
    (its wrapper would type as Any); what else a tokenizer offers (chat templates, the
    vocabulary, thinking and tool-call markers) is read where it is needed, from the object
    as it is."""

    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> Any:
        """The token ids (a `list[int]`): typed Any until `completion_tokens`
        (generation/_prompts.py) narrows a prompt of token ids, which it assigns the same
        variable."""

    def decode(self, token_ids: list[int], /) -> str: ...

    def convert_ids_to_tokens(self, ids: list[int], /) -> list[str | None]:
        """The vocabulary's own token strings (byte-level markers and all; None: an id the
        tokenizer has no token for), as /tokenize's `token_strs` gives them."""


def _probability(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be within [0, 1], got {value}")


def _seed(_: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"seed must be a 64-bit integer (signed or not), got {value}")


PRIORITY_LIMIT = 100
"""A request's `priority` is within [-PRIORITY_LIMIT, PRIORITY_LIMIT]: a bounded range keeps
aging's bound on a wait finite and small, and the per-priority metrics few
(docs/decisions/0044-priorities.md)."""


def _priority(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not -PRIORITY_LIMIT <= value <= PRIORITY_LIMIT:
        raise ValueError(f"priority must be within [-{PRIORITY_LIMIT}, {PRIORITY_LIMIT}]")


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _processors(values: Iterable[LogitsProcessor]) -> tuple[LogitsProcessor, ...]:
    return tuple(values)


@attrs.frozen
class SamplingParams:
    """How the next token is chosen. Defaults leave the distribution untouched."""

    temperature: float = attrs.field(default=1.0, validator=v.ge(0.0))
    top_p: float = attrs.field(default=1.0, validator=_probability)
    top_k: int = attrs.field(default=0, validator=v.ge(0))
    min_p: float = attrs.field(default=0.0, validator=_probability)
    seed: int | None = attrs.field(default=None, validator=_seed)
    """Any 64-bit integer, signed or not (taken modulo 2^64); None draws a random one."""
    repetition_penalty: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None


@attrs.frozen(eq=False)
class ImageInputs:
    """A prompt's images as a vision-language model's processor prepared them: its arrays
    (pixel values, image grids, ...; NumPy, no MLX) by the keyword the model's encoder takes
    them under. The prompt's token ids already hold one placeholder per image token."""

    arrays: Mapping[str, npt.NDArray[np.generic]]
    image_tokens: int = attrs.field(validator=v.ge(0))
    digests: tuple[bytes, ...] = attrs.field(validator=v.min_len(1))
    """Each image's identity (a hash of its decoded pixels), in prompt order: what the prefix
    cache keys an image's placeholder tokens by."""

    @property
    def images(self) -> int:
        return len(self.digests)


def _delays(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(float(value) for value in values)


def _texts(values: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


def _pieces(values: Iterable[Iterable[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(token) for token in piece) for piece in values)


def _non_negative(_: object, attribute: attrs.Attribute[Any], values: tuple[float, ...]) -> None:
    if any(not value >= 0.0 for value in values):  # NaN fails too
        raise ValueError(f"{attribute.name} must be non-negative seconds")


@attrs.frozen
class Script:
    """What the scripted model (models/scripted.py) answers one request, and when.

    `pieces` are emitted one per step, in order: a piece is one token, or several (a chunk)
    that arrive together. `delays[i]` is the time before piece `i` (the first: from the
    sequence's admission; the others: from the previous piece's due time), and `delays[-1]`
    the time before the end when there is no piece. After the last piece the sequence ends
    on its EOS ("stop"), in the same step, unless `max_tokens` ended it first ("length").
    `error_after`: the sequence fails after that many pieces (or after its last, if it has
    fewer), as a real failure would: the client gets an error, not a finish.
    `texts`: each piece's text, where the script was written as chunks: the client gets
    each chunk's text as written, at its last token (`_scripted.ChunkDetokenizer`), not as
    a streaming detokenizer would cut it (it holds back a trailing space, a word's end)."""

    pieces: tuple[tuple[int, ...], ...] = attrs.field(default=(), converter=_pieces)
    delays: tuple[float, ...] = attrs.field(default=(0.0,), converter=_delays)
    error_after: int | None = attrs.field(default=None, validator=v.optional(v.ge(0)))
    texts: tuple[str, ...] | None = attrs.field(default=None, converter=_texts)

    @delays.validator
    def _check_delays(self, attribute: attrs.Attribute[Any], values: tuple[float, ...]) -> None:
        _non_negative(self, attribute, values)
        if len(values) != len(self.pieces) + 1:
            raise ValueError("a script has one delay per piece, and one before the end")

    @texts.validator
    def _check_texts(self, attribute: attrs.Attribute[Any], values: tuple[str, ...] | None) -> None:
        if values is not None and len(values) != len(self.pieces):
            raise ValueError("a script's texts are one per piece")


@attrs.frozen
class GenerationRequest:
    """One sequence to generate.

    `stop_token_ids` end generation in addition to the model's EOS tokens,
    unless `ignore_eos` is set (benchmarks on random-weight models need it).
    `logprobs`: None for none, 0 for the sampled token's, k for the top k as well.
    `cache_key` namespaces the prefix cache (per tenant, per conversation...).
    `logits_processors` are called with the context (the prompt and every token fed so far)
    and the logits; they must derive any state from that context, not from the number of
    calls: after a failed batch step the engine replays a sequence from an earlier point.
    """

    prompt_tokens: tuple[int, ...] = attrs.field(converter=_int_tuple, validator=v.min_len(1))
    max_tokens: int = attrs.field(validator=v.ge(1))
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    stop_token_ids: frozenset[int] = attrs.field(default=frozenset(), converter=frozenset)
    ignore_eos: bool = False
    logits_processors: tuple[LogitsProcessor, ...] = attrs.field(default=(), converter=_processors)
    logprobs: int | None = attrs.field(
        default=None, validator=v.optional(v.and_(v.ge(0), v.le(20)))
    )
    trim_leading_space: bool = False
    """Drop one space from the start of the text (a chat reply); False gives the exact
    continuation of the prompt (a completion), whatever its first token begins with."""
    cache_key: str | None = None
    images: ImageInputs | None = None
    """For a vision-language model: the prompt's images. Its prompt is encoded and
    prefilled with them on admission, and never shared through the prefix cache (its
    placeholder ids are the same whatever the image)."""
    script: Script | None = None
    """For the scripted model: its output and timing (None: it ends at once). Other models
    ignore it; the testing package's harness gives it to the scripted model only."""
    tenant: str | None = None
    """Whose request (opaque: the server's digest of the API key). Lanes go fairly among
    tenants, and one tenant may hold at most `EngineConfig.max_queue_per_tenant` places in
    the queue; None is one tenant among the others, without the queue share."""
    priority: int = attrs.field(default=0, validator=_priority)
    """Lower runs first (vLLM's convention; 0 by default). It orders the wait for a lane and
    for KV memory, and a request may take the lane or the memory of a running one of a worse
    priority, which is taken off the device and resumed later with the tokens it had
    (`_lanes`, `_yielding`; aging and a bound keep it starvation-free). Within a priority,
    lanes go fairly among tenants as before."""
    adapter: str | None = None
    """The LoRA adapter the sequence runs with, by the name it was loaded under (None: the
    base model). Rows of different adapters and of the base decode in one batch."""
    report_admission: bool = False
    """Send a first event when the sequence is admitted, before its prefill: no token, no
    finish reason, and its `usage` (the prompt's tokens, those read from the prefix cache;
    none generated). For a stream that states the prompt's usage before any output
    (Anthropic's `message_start`), in the same numbers as its end."""


@attrs.frozen
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    draft_tokens: int = 0
    """Tokens speculation drafted for the sequence (none unless it is on)."""
    accepted_draft_tokens: int = 0
    """Of `draft_tokens`, those in the completion (counted in `completion_tokens` too); the
    others were computed and dropped, and are not."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen
class TokenEvent:
    """One step's output for one sequence.

    Token events carry `token_id` and the text it completed (`text` may be ""
    while a multi-byte character is still partial). The last event of a stream
    has `finish_reason` and `usage` set; it has no token when the sequence ended
    on a stop token (whose text is never emitted), was cancelled or failed. A request
    with `report_admission` gets one more, first: no token, no finish reason, `usage`.
    """

    token_id: int | None
    text: str
    logprob: TokenLogprob | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None

    @property
    def is_final(self) -> bool:
        return self.finish_reason is not None
