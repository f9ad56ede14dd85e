"""From wire fields to engine parameters: validation with the parameter named in every error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..engine import PRIORITY_LIMIT, SamplingParams
from ._errors import InvalidRequest, quoted
from ._request_parts import SamplingFields

MAX_STOP_STRINGS = 4
_TOKEN_ID_DIGITS = 10
"""A logit_bias key longer than this cannot be a token id of any vocabulary (and int() of a
long digit string is not free)."""


@attrs.frozen
class RequestCaps:
    """What one request may ask for, checked before its prompt is rendered (each a setting:
    `--max-messages`, `--max-tools`, `--max-tokens-ceiling`)."""

    max_messages: int = 1000
    """Chat messages, or a Responses conversation with its previous turns."""
    max_tools: int = 128
    """Tools offered in one request (OpenAI's own limit)."""
    max_tokens: int | None = None
    """The largest token budget a request may set (None: the context's room)."""


def check_count(count: int, limit: int, param: str) -> None:
    """A 400 naming `param` when a request gives more than `limit` of it."""
    if count > limit:
        raise InvalidRequest(
            f"{param} holds {count} items; this server takes at most {limit}",
            param=param,
            code="too_many_items",
        )


def require(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise InvalidRequest(message, param=param, code="invalid_value")


def check_between(value: float | None, low: float, high: float, param: str) -> None:
    """A sampling field's range, as every API words it (None: not given)."""
    require(
        value is None or low <= value <= high,
        param,
        f"{param} must be between {low:g} and {high:g}",
    )


def reject_unimplemented(request: Any, fields: dict[str, object]) -> None:
    """Reject each field set to anything but its no-op value: `{field: allowed value(s)}`.

    A field accepted and ignored would silently change a client's results; a 400
    naming it tells the client at once.
    """
    for name, allowed in fields.items():
        value = getattr(request, name)
        allowed_values = allowed if isinstance(allowed, tuple) else (allowed,)
        if value is None or value in allowed_values:
            continue
        raise InvalidRequest(
            f"'{name}' is not supported by this server (got {quoted(value)})",
            param=name,
            code="unsupported_parameter",
        )


def ignored_hints(request: Any, hints: dict[str, object], *, strict: bool) -> tuple[str, ...]:
    """The hints set on `request` (to anything but their no-op values, `{field: no-op(s)}`)
    that this server cannot act on: fields that would not change the answer (a reasoning
    effort for a model without reasoning, a verbosity, a cache retention), which clients
    send by default. They are accepted and named in the response's `x-ignored-params`
    header; with `strict` (`--strict-params`) each is a 400, as unimplemented fields are."""
    given: dict[str, object] = {}
    for name, no_op in hints.items():
        value = getattr(request, name)
        if value is None or value in (no_op if isinstance(no_op, tuple) else (no_op,)):
            continue
        given[name] = value
    return ignored_values(given, strict=strict)


def ignored_values(given: Mapping[str, object], *, strict: bool) -> tuple[str, ...]:
    """`ignored_hints` for hints already found set (nested fields, content parts): their
    names for the `x-ignored-params` header, or, with `strict`, a 400 for the first."""
    if strict and given:
        name, value = next(iter(given.items()))
        raise InvalidRequest(
            f"'{name}' is not supported by this server (got {quoted(value)}); it is accepted "
            "and ignored unless the server runs with --strict-params",
            param=name,
            code="unsupported_parameter",
        )
    return tuple(given)


def sampling_from(fields: SamplingFields) -> SamplingParams:
    check_between(fields.temperature, 0.0, 2.0, "temperature")
    temperature = 1.0 if fields.temperature is None else fields.temperature
    top_p = 1.0 if fields.top_p is None else fields.top_p
    require(0.0 < top_p <= 1.0, "top_p", "top_p must be greater than 0 and at most 1")
    top_k = fields.top_k or 0
    require(top_k >= 0, "top_k", "top_k must be 0 (disabled) or positive")
    check_between(fields.min_p, 0.0, 1.0, "min_p")
    min_p = fields.min_p or 0.0
    check_between(fields.presence_penalty, -2.0, 2.0, "presence_penalty")
    check_between(fields.frequency_penalty, -2.0, 2.0, "frequency_penalty")
    if fields.repetition_penalty is not None:
        require(
            fields.repetition_penalty > 0,
            "repetition_penalty",
            "repetition_penalty must be positive",
        )
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=fields.seed,
        repetition_penalty=fields.repetition_penalty,
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        logit_bias=_logit_bias(fields.logit_bias),
    )


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    if not raw:
        return None
    bias: dict[int, float] = {}
    for key, value in raw.items():
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        require(
            key.isascii() and key.isdigit() and len(key) <= _TOKEN_ID_DIGITS,
            "logit_bias",
            f"logit_bias keys must be token ids, got {quoted(key)}",
        )
        require(
            -100.0 <= value <= 100.0, "logit_bias", "logit_bias values must be between -100 and 100"
        )
        bias[int(key)] = value
    return bias


def validate_vocab(bias: Mapping[int, float] | None, vocab_size: int) -> None:
    """Each biased id must be one the model takes (below its embedding rows, `vocab_size`):
    past them there is no logit to bias. An id below them that the tokenizer has no text
    for (a hole, a padded row) is honoured; sampled, it stands for no text."""
    for token in bias or {}:
        require(
            token < vocab_size,
            "logit_bias",
            f"logit_bias token id {token} is out of range: this model's token ids are "
            f"0..{vocab_size - 1}",
        )


MIN_TEMPERATURE = 1e-30
"""Below this, temperature is 0 (greedy, its limit): the engine draws from
`logprobs * (1 / temperature)` in float32, which must stay finite (5e-324, which JSON and
the API allow, made it inf * 0: NaN, and a random token)."""


def for_engine(sampling: SamplingParams, vocab_size: int) -> SamplingParams:
    """The sampling parameters in the range the engine's float32 arithmetic handles, with the
    same tokens kept.

    `top_k` at or beyond the vocabulary keeps every token: the same as 0 (disabled), never a
    k its top-k cannot take. `top_p` below 1 / vocab_size keeps only the most likely token,
    as 1 / vocab_size does (the most likely token's share of the mass is at least that); a
    much smaller one (the API allows 1e-300) is 0 in float32, and the filter dropped every
    token. A temperature below MIN_TEMPERATURE is greedy decoding."""
    if sampling.top_k >= vocab_size:
        sampling = attrs.evolve(sampling, top_k=0)
    if sampling.top_p < 1 / vocab_size:
        sampling = attrs.evolve(sampling, top_p=1 / vocab_size)
    if 0 < sampling.temperature < MIN_TEMPERATURE:
        sampling = attrs.evolve(sampling, temperature=0.0)
    return sampling


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    require(
        len(stops) <= MAX_STOP_STRINGS, "stop", f"stop takes at most {MAX_STOP_STRINGS} strings"
    )
    require(all(stops), "stop", "stop strings must not be empty")
    return tuple(stops)


SERVICE_TIERS: dict[str, int] = {
    "priority": -1,
    "fast": -1,  # OpenAI's other name for it ("the response will show priority")
    "ultrafast": -1,  # the Responses API's: there is no faster class here
    "auto": 0,
    "default": 0,
    "scale": 0,
    "flex": 1,
}
"""OpenAI's `service_tier` values, as the priorities they stand for here."""


def request_priority(priority: int | None, service_tier: str | None) -> tuple[int, str | None]:
    """The engine priority of a request (`priority`, vLLM's extension field, lower first;
    else its OpenAI `service_tier`'s class; else 0), and the tier to echo in the response
    (None unless `service_tier` was sent, as OpenAI answers): the tier actually served,
    which `priority` decides where both are sent."""
    if service_tier is not None:
        require(
            service_tier in SERVICE_TIERS,
            "service_tier",
            f"service_tier must be one of {', '.join(SERVICE_TIERS)}, got {quoted(service_tier)}",
        )
    if priority is not None:
        require(
            -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT,
            "priority",
            f"priority must be an integer from -{PRIORITY_LIMIT} to {PRIORITY_LIMIT} (lower "
            f"runs first), got {priority}",
        )
    value = priority if priority is not None else SERVICE_TIERS.get(service_tier or "auto", 0)
    if service_tier is None:
        return value, None
    return value, "priority" if value < 0 else "flex" if value > 0 else "default"


def check_n(n: int | None) -> None:
    if n is not None and n < 1:
        raise InvalidRequest(f"n must be at least 1, got {n}", param="n", code="invalid_value")
    if n is not None and n != 1:
        raise InvalidRequest(
            f"n={n} is not supported: this server returns one choice (n=1)",
            param="n",
            code="unsupported_parameter",
        )


def max_tokens(
    requested: int | None, param: str, default: int | None, room: int, ceiling: int | None = None
) -> int:
    """The token budget: the request's, else the server default, else the context's room;
    a request's above `ceiling` is a 400, a default above it is lowered to it."""
    if requested is not None:
        require(requested >= 1, param, f"{param} must be at least 1, got {requested}")
        if ceiling is not None:
            require(
                requested <= ceiling,
                param,
                f"{param} is at most {ceiling} on this server, got {requested}",
            )
        return requested
    budget = max(room, 1) if default is None else min(default, max(room, 1))
    return budget if ceiling is None else min(budget, ceiling)
