"""The `script` extension field's wire classes (attrs; the one converter structures them).

Apart from `_scripts` (which turns a script into the engine's) so that the request classes
can declare the field without importing what the scripts need.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs


@attrs.frozen
class ScriptToolCall:
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ScriptOutput:
    """Exactly one of its fields is given (`output_pieces` checks)."""

    text: str | None = None
    chunks: list[str] | None = None
    tool_call: ScriptToolCall | None = None
    json: Any = None
    echo: Literal[True] | None = None


@attrs.frozen
class DelayRange:
    """A delay drawn uniformly from [min, max] for each piece, by a generator seeded once per
    request (`seed`; None: a random seed)."""

    min: float
    max: float
    seed: int | None = None


@attrs.frozen
class Stall:
    at: int
    """The piece (a token; a chunk for `chunks`) it comes before, from 0."""
    seconds: float


@attrs.frozen
class ScriptFault:
    error_after: int | None = None
    """The stream fails after this many pieces (an error event; non-streaming: a 500)."""
    drop_after: int | None = None
    """The server drops the connection after this many pieces, mid-stream: no error event,
    no end of the chunked body (streams only)."""
    status: int | None = None
    """The request is answered with this HTTP status at once (429, 500 or 503)."""
    retry_after: float | None = None
    """Seconds in Retry-After (429 and 503; 1 when not given)."""
    times: int | None = None
    """The fault hits only the first `times` requests with this script (counted per served
    model); later ones run the script without it, as a retry that succeeds. None: all."""
    key: str | None = None
    """Tells otherwise equal scripts' counts apart (e.g. one per test)."""


@attrs.frozen
class ScriptUsage:
    """Token counts the response reports instead of the real ones (each left out: real)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


@attrs.frozen
class ScriptSpec:
    """The `script` field as the wire gives it."""

    output: dict[str, Any] | None = None
    ttft: float = 0.0
    token_delay: float | DelayRange = 0.0
    stalls: list[Stall] = attrs.field(factory=list)
    fault: ScriptFault | None = None
    usage: ScriptUsage | None = None
