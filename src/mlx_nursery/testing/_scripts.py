"""The `script` extension field: what the scripted model answers a request, and when.

A test harness sets it on chat completions, completions, Responses and Messages requests
(the openai SDK: `extra_body={"script": {...}}`); only the scripted model (`--model
scripted`) accepts it. It is validated strictly, as the rest of the body is (an unknown key
is a 400 naming its path), and turned into the engine's `Script` here, on the preparation
thread: the output is tokenized with the model's tokenizer, the delays drawn. The schema is
documented in docs/testing-clients.md. The harness (`_harness.py`) takes the field off the
body and runs `ScriptedPlans` on each plan, through the seam (`serving/_extensions.py`).
"""

from __future__ import annotations

import json
import math
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ..engine import Script, Tokenizer, Usage
from ..generation import FaultStatus, InvalidRequest, Prepared, structure, to_json
from ._script_schema import DelayRange, ScriptOutput, ScriptSpec

DEFAULT_TEXT = "This is a scripted reply."
"""What the scripted model answers a request without a script (and no `--script`)."""
MAX_SECONDS = 3600.0
"""The longest any one scripted wait may be."""
FAULT_STATUSES = (429, 500, 503)
OUTPUT_KINDS = ("text", "chunks", "tool_call", "json", "echo")


def parse_script(value: Any, param: str = "script") -> ScriptSpec:
    """`value` (a `--script` file's JSON) as a script; raises InvalidRequest naming the path."""
    spec = structure(value, ScriptSpec, param)
    check_script(spec, param)
    return spec


def check_script(spec: ScriptSpec, param: str = "script") -> None:
    """What the schema's types do not say: ranges, and one output kind. Raises InvalidRequest."""
    _seconds(spec.ttft, f"{param}.ttft")
    if isinstance(spec.token_delay, DelayRange):
        _seconds(spec.token_delay.min, f"{param}.token_delay.min")
        _seconds(spec.token_delay.max, f"{param}.token_delay.max")
        _require(
            spec.token_delay.min <= spec.token_delay.max,
            f"{param}.token_delay",
            "token_delay.min must not exceed token_delay.max",
        )
    else:
        _seconds(spec.token_delay, f"{param}.token_delay")
    for i, stall in enumerate(spec.stalls):
        _require(stall.at >= 0, f"{param}.stalls[{i}].at", "a stall's index must be >= 0")
        _seconds(stall.seconds, f"{param}.stalls[{i}].seconds")
    if spec.output is not None:
        _output(spec.output, f"{param}.output")
    if spec.usage is not None:
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            count = getattr(spec.usage, name)
            _require(count is None or count >= 0, f"{param}.usage.{name}", f"{name} must be >= 0")
    fault = spec.fault
    if fault is not None:
        where = f"{param}.fault"
        kinds = (fault.error_after, fault.drop_after, fault.status)
        _require(
            sum(kind is not None for kind in kinds) == 1,
            where,
            "a fault is one of error_after, drop_after or status",
        )
        if fault.error_after is not None:
            _require(fault.error_after >= 0, f"{where}.error_after", "error_after must be >= 0")
        if fault.drop_after is not None:
            _require(fault.drop_after >= 0, f"{where}.drop_after", "drop_after must be >= 0")
        if fault.status is not None:
            _require(
                fault.status in FAULT_STATUSES,
                f"{where}.status",
                f"status must be one of {', '.join(map(str, FAULT_STATUSES))}",
            )
        if fault.times is not None:
            _require(fault.times >= 1, f"{where}.times", "times must be >= 1")
        if fault.retry_after is not None:
            _require(
                fault.status in (429, 503),
                f"{where}.retry_after",
                "retry_after goes with status 429 or 503",
            )
            _seconds(fault.retry_after, f"{where}.retry_after")


def _output(raw: dict[str, Any], param: str) -> ScriptOutput:
    given = list(raw)
    _require(
        len(given) == 1,
        param,
        f"output takes exactly one of {', '.join(OUTPUT_KINDS)} (got {len(given)})",
    )
    output = structure(raw, ScriptOutput, param)
    if output.tool_call is not None:
        _require(bool(output.tool_call.name), f"{param}.tool_call.name", "a tool needs a name")
    return output


class FaultCounts:
    """How many requests each script with `fault.times` has faulted, so that the first
    attempts fail and a retry of the same body succeeds. At most `MAX_SCRIPTS` scripts are
    remembered (the least recently seen is forgotten). Thread-safe."""

    MAX_SCRIPTS = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: OrderedDict[str, int] = OrderedDict()

    def take(self, spec: ScriptSpec, times: int) -> bool:
        """True (and counted) while `spec`'s fault has hit fewer than `times` requests."""
        key = json.dumps(to_json(spec), sort_keys=True)
        with self._lock:
            count = self._counts.pop(key, 0)
            self._counts[key] = min(count + 1, times)
            while len(self._counts) > self.MAX_SCRIPTS:
                self._counts.popitem(last=False)
            return count < times


def script_for(
    spec: ScriptSpec | None,
    default: ScriptSpec | None,
    tokenizer: Any,
    *,
    echo: Callable[[], str],
    counts: FaultCounts | None = None,
) -> Script:
    """The engine's script for a request: its own, else the server's default (`--script`),
    else `DEFAULT_TEXT` at once. Raises `FaultStatus` for a status fault (the request
    is answered before it is queued), InvalidRequest for an output that cannot be rendered.
    `echo` gives the request's last user text; `counts` tracks faults with `times` (None:
    every request faults). Preparation thread (it tokenizes)."""
    param = "script"
    if spec is None:
        spec, param = default or ScriptSpec(), "--script"
    fault = spec.fault
    if fault is not None and fault.times is not None and counts is not None:
        # Past its first `times` requests, the script runs without its fault.
        fault = fault if counts.take(spec, fault.times) else None
    if fault is not None and fault.status is not None:
        retry_after = fault.retry_after
        if retry_after is None and fault.status in (429, 503):
            retry_after = 1.0
        raise FaultStatus(
            fault.status,
            f"scripted fault: status {fault.status}",
            code="scripted_fault",
            retry_after=retry_after,
        )
    raw = spec.output if spec.output is not None else {"text": DEFAULT_TEXT}
    output = _output(raw, f"{param}.output")
    pieces = output_pieces(output, tokenizer, echo)
    stalls: dict[int, float] = {}
    for stall in spec.stalls:
        stalls[stall.at] = stalls.get(stall.at, 0.0) + stall.seconds
    draw = _delays(spec.token_delay)
    delays = [spec.ttft + stalls.get(0, 0.0)]
    delays += [draw() + stalls.get(i, 0.0) for i in range(1, len(pieces))]
    delays.append(0.0 if pieces else delays.pop())  # the end rides with the last piece
    # A dropped connection is a failure after its pieces, which the HTTP layer turns into a
    # cut connection instead of an error event (`drops_connection`).
    fails_after = None
    if fault is not None:
        fails_after = fault.error_after if fault.error_after is not None else fault.drop_after
    return Script(pieces, delays, fails_after, texts=output.chunks)


def drops_connection(spec: ScriptSpec | None, script: Script) -> bool:
    """Whether `script`'s failure is `spec`'s `drop_after` (still armed: a fault with
    `times` disarms after its first requests)."""
    fault = spec.fault if spec is not None else None
    return fault is not None and fault.drop_after is not None and script.error_after is not None


def output_pieces(output: ScriptOutput, tokenizer: Any, echo: Callable[[], str]) -> list[list[int]]:
    """The output as pieces of token ids: a token each, or a chunk's tokens for `chunks`. A
    tool call is written in the Hermes format the scripted model's template uses, which the
    server's tool-call extraction reads back as `tool_calls` (when the request offers tools)."""

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    if output.chunks is not None:
        return [encode(chunk) for chunk in output.chunks]
    if output.tool_call is not None:
        call = {"name": output.tool_call.name, "arguments": output.tool_call.arguments}
        text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    elif output.echo is not None:
        text = echo()
    elif output.text is not None:
        text = output.text
    else:
        text = json.dumps(output.json)
    return [[token] for token in encode(text)]


def refuse_script(param: str = "script") -> InvalidRequest:
    """The 400 for a script sent to a model that is not the scripted one."""
    return InvalidRequest(
        "script is accepted only by the scripted model (mlx-nursery serve --model scripted)",
        param=param,
        code="unsupported_parameter",
    )


def _delays(delay: float | DelayRange) -> Callable[[], float]:
    if isinstance(delay, DelayRange):
        rng = random.Random(delay.seed)
        low, high = delay.min, delay.max
        return lambda: rng.uniform(low, high)
    return lambda: delay


def _seconds(value: float, param: str) -> None:
    _require(
        math.isfinite(value) and 0.0 <= value <= MAX_SECONDS,
        param,
        f"seconds must be between 0 and {MAX_SECONDS:g}",
    )


def _require(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise InvalidRequest(message, param=param, code="invalid_value")


def reported_usage(spec: ScriptSpec | None) -> Callable[[Usage], Usage] | None:
    """How `spec.usage` rewrites a response's usage (None: the real counts)."""
    wanted = spec.usage if spec is not None else None
    if wanted is None:
        return None

    def rewrite(real: Usage) -> Usage:
        return Usage(
            real.prompt_tokens if wanted.prompt_tokens is None else wanted.prompt_tokens,
            real.completion_tokens
            if wanted.completion_tokens is None
            else wanted.completion_tokens,
            real.cached_tokens if wanted.cached_tokens is None else wanted.cached_tokens,
        )

    return rewrite


@attrs.frozen
class _ScriptField:
    """The field as a request body holds it: its errors name `script.…`, as the request's own
    fields' errors name theirs."""

    script: ScriptSpec | None = None


def parse_field(value: Any) -> ScriptSpec | None:
    """A request's `script` (null: none). Raises InvalidRequest naming the path."""
    return structure({"script": value}, _ScriptField).script


@attrs.frozen
class ScriptedPlans:
    """The scripted model's plans: each request's script (its own, or the default) is the
    engine's `Script`. One per loaded model: its `fault.times` counts are the model's."""

    tokenizer: Tokenizer
    default: ScriptSpec | None
    """`--script`'s (None: `DEFAULT_TEXT`)."""
    counts: FaultCounts = attrs.field(factory=FaultCounts)

    def __call__(self, prepared: Prepared, fields: Mapping[str, object], body: Any) -> Prepared:
        """The plan running its script. Raises the script's HTTP fault (`FaultStatus`)
        here, before the request is queued; a 400 for a `drop_after` on a request that does
        not stream. Tokenizes: preparation thread."""
        spec = fields.get("script")
        assert spec is None or isinstance(spec, ScriptSpec)
        if spec is not None:
            check_script(spec)
            if spec.fault is not None and spec.fault.drop_after is not None and not prepared.stream:
                raise InvalidRequest(
                    "drop_after cuts a stream: it needs stream: true",
                    param="script.fault.drop_after",
                    code="invalid_value",
                )
        script = script_for(
            spec, self.default, self.tokenizer, echo=prepared.user_text, counts=self.counts
        )
        chosen = spec if spec is not None else self.default
        # Chunks come as written: a first chunk's leading space stays (the logprobs too).
        trim = prepared.generation.trim_leading_space and script.texts is None
        return attrs.evolve(
            prepared,
            generation=attrs.evolve(prepared.generation, script=script, trim_leading_space=trim),
            drop_on_failure=drops_connection(chosen, script) and prepared.stream,
            usage=reported_usage(chosen),
        )


def refuse_field(prepared: Prepared, fields: Mapping[str, object], body: Any) -> Prepared:
    """Any other model's plans: a script is a 400."""
    if fields.get("script") is not None:
        raise refuse_script()
    return prepared
