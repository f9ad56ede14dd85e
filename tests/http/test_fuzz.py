"""Fuzz of the HTTP surface (issue 15): generated requests through a real server.

Hypothesis draws requests for `POST /v1/chat/completions`, `POST /v1/completions` and
`POST /v1/responses` (after the official OpenAPI spec, tests/reference/openai-openapi.yaml)
in three flavours, streaming and not:

- **valid**: what the spec accepts, within what this server documents as implemented
  (README: `n` 1, `strict` tools only with a forced tool_choice, no logprobs with tools).
  Each must succeed (2xx, or 503/504).
- **almost valid**: a valid request with one thing wrong: a required field dropped, an
  unknown field, a field of the wrong type, a value out of range, an unknown model.
- **hostile**: deep nesting, integers past every limit, NaN and Infinity, lone UTF-16
  surrogates, non-ASCII digits as logit_bias keys, odd tool_choice shapes, huge strings,
  seeds like -1 and 2**64, top_k beyond the vocabulary, hostile JSON schemas, bodies that are
  not JSON, wrong content types, long URLs and headers, odd paths and methods.

Every case goes through Hypercorn on a real socket serving the tiny random model (in a
thread of its own, restarted after a case that leaves it unhealthy); each outcome must hold:
no 5xx other than 503/504; every non-2xx body is OpenAI's error envelope (and short: an error
never echoes a large value back); every 200 body and SSE event parses and matches the spec;
every 200 stream ends with a terminal event (a finish_reason then `[DONE]`,
`response.completed` / `.incomplete` / `.failed`, or an error event that is not a server
failure); the keep-alive connection still serves the next request; `/health` is 200 after
every case.

`MLX_NURSERY_FUZZ_EXAMPLES` sets the examples per flavour (default `DEFAULT_EXAMPLES`, about
10 s a flavour on 2 CPU cores); `MLX_NURSERY_FUZZ_MAX_BYTES` the largest generated string or
body; `MLX_NURSERY_FUZZ_SHRINK=1` shrinks a failure to a minimal case (minutes per failure).
The derandomized examples are the same in every run. bench/fuzz_soak.py runs the same
strategies for 10,000 cases against a server process and counts the outcomes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.http_helpers import openapi_spec, running_server, validate, validate_error

MODEL = "tiny"
VOCAB = 2048  # the tiny model's vocabulary: top_k and token ids beyond it are out of range
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
}
DEFAULT_EXAMPLES = 150
EXAMPLES = int(os.environ.get("MLX_NURSERY_FUZZ_EXAMPLES") or DEFAULT_EXAMPLES)
MAX_BYTES = int(os.environ.get("MLX_NURSERY_FUZZ_MAX_BYTES") or 300_000)
"""Largest huge string or body generated. The server's --max-request-bytes is 8 MiB; the
bench raises this to test past it."""
MAX_HEAD_BYTES = 48 * 1024
"""Largest URL or header generated: past Hypercorn's own head limit (64 KiB) the answer is
Hypercorn's, not the server's."""
MAX_ERROR_BODY = 32 * 1024
"""An error body larger than this echoes the request back."""
READ_TIMEOUT = 60.0
CASE_DEADLINE = 120.0
SERVER_SETTINGS: dict[str, Any] = {
    "request_timeout": 20.0,
    "max_concurrency": 4,
    "default_max_tokens": 16,
}
"""default_max_tokens: a request without a budget (a dropped max_tokens) would otherwise run to
the end of the context, seconds of compute for nothing the checks need."""


# -- requests ---------------------------------------------------------------------------------
@attrs.frozen
class Raw:
    """A JSON fragment written verbatim: numbers Python would not print, NaN, deep nesting."""

    text: str

    def __repr__(self) -> str:
        return f"Raw({_short(self.text, 60)!r})"


@attrs.frozen
class Previous:
    """`previous_response_id`: a response stored earlier in the run, picked when sent."""

    pick: int


@attrs.frozen
class Case:
    flavour: str
    endpoint: str
    """chat / completions / responses, or "other" for the retrieval routes."""
    body: Any
    """A JSON value (with `Raw` / `Previous` leaves), or bytes sent as they are, or None."""
    method: str = "POST"
    path: str = ""
    content_type: str | None = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    ascii: bool = True
    """JSON text escaped to ASCII; False writes UTF-8 (lone surrogates as invalid bytes)."""
    note: str = ""

    @property
    def url(self) -> str:
        return self.path or PATHS[self.endpoint]

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def json_body(self) -> bool:
        """The body is a JSON object we wrote (not raw bytes): `stream` says what was asked."""
        return isinstance(self.body, dict)

    def payload(self, stored: list[str]) -> bytes | None:
        if self.body is None or isinstance(self.body, bytes):
            return self.body
        return encode(self.body, stored, ascii=self.ascii).encode("utf-8", "surrogatepass")

    def describe(self, limit: int = 600) -> str:
        body = (
            self.body
            if isinstance(self.body, bytes) or self.body is None
            else encode(self.body, [])
        )
        head = f"{self.flavour} {self.method} {_short(self.url, 120)}"
        if self.content_type != "application/json":
            head += f" [content-type {self.content_type!r}]"
        if self.headers:
            head += f" [headers {[(k, _short(v, 40)) for k, v in self.headers]}]"
        if self.note:
            head += f" ({self.note})"
        return f"{head}: {_short(repr(body) if isinstance(body, bytes) else str(body), limit)}"


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def encode(value: Any, stored: list[str], *, ascii: bool = True) -> str:
    """JSON text of `value`; `Raw` leaves verbatim, `Previous` resolved against `stored`."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Previous):
        return json.dumps(stored[value.pick % len(stored)]) if stored else "null"
    if isinstance(value, dict):
        items = (
            f"{json.dumps(k, ensure_ascii=ascii)}:{encode(v, stored, ascii=ascii)}"
            for k, v in value.items()
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode(v, stored, ascii=ascii) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii)


# -- valid requests ---------------------------------------------------------------------------
_WORDS = [
    "hello",
    "world",
    "the",
    "capital",
    "of",
    "France",
    "is",
    " ",
    "\n",
    "é",
    "中文",
    "🙂",
    "{",
    "}",
    '"',
    "\\",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "0",
]
short_text = st.one_of(
    st.text(max_size=24), st.lists(st.sampled_from(_WORDS), max_size=8).map("".join)
)
nonempty_text = st.one_of(
    st.text(min_size=1, max_size=24),
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=8).map("".join),
)
names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_-]{0,16}", fullmatch=True)
ids = st.from_regex(r"call_[a-zA-Z0-9]{1,12}", fullmatch=True)
small_tokens = st.integers(1, 8)


def number(low: float, high: float, *, exclude_min: bool = False) -> st.SearchStrategy[float | int]:
    """A JSON number in range, as a float or, where one fits, an integer (OpenAI accepts both)."""
    first = math.floor(low) + 1 if exclude_min else math.ceil(low)
    return st.one_of(
        st.floats(low, high, exclude_min=exclude_min), st.integers(first, math.floor(high))
    )


scalar_schema = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "string", "enum": ["a", "b"]},
        {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    ]
)
object_schema = st.dictionaries(names, scalar_schema, max_size=3).map(
    lambda props: {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }
)
json_arguments = st.dictionaries(
    names, st.one_of(st.integers(-5, 5), short_text, st.booleans()), max_size=3
).map(json.dumps)


def sampling_fields() -> st.SearchStrategy[dict[str, Any]]:
    """Chat and completions share these (top_k, min_p, repetition_penalty are this server's)."""
    return st.fixed_dictionaries(
        {},
        optional={
            "temperature": number(0, 2),
            "top_p": number(0, 1, exclude_min=True),
            "top_k": st.integers(0, VOCAB - 1),
            "min_p": number(0, 1),
            "seed": st.integers(-(2**63), 2**63 - 1),
            "presence_penalty": number(-2, 2),
            "frequency_penalty": number(-2, 2),
            "repetition_penalty": number(0.5, 2),
            "logit_bias": st.dictionaries(
                st.integers(0, VOCAB - 1).map(str), number(-100, 100), max_size=4
            ),
            "stop": st.one_of(
                st.none(), nonempty_text, st.lists(nonempty_text, min_size=1, max_size=4)
            ),
            "n": st.just(1),
            "user": short_text,
        },
    )


def with_stream(fields: dict[str, Any], stream: bool, include_usage: bool | None) -> dict[str, Any]:
    if stream:
        fields["stream"] = True
        if include_usage is not None:
            fields["stream_options"] = {"include_usage": include_usage}
    elif include_usage is not None:
        fields["stream"] = False
    return fields


def chat_tools() -> st.SearchStrategy[list[dict[str, Any]]]:
    function = st.fixed_dictionaries(
        {"name": names}, optional={"description": short_text, "parameters": object_schema}
    )
    return st.lists(
        st.fixed_dictionaries({"type": st.just("function"), "function": function}),
        min_size=1,
        max_size=3,
        unique_by=lambda t: t["function"]["name"],
    )


content_parts = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": short_text}), min_size=1, max_size=3
)
chat_content = st.one_of(short_text, content_parts)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": ids,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": names, "arguments": json_arguments}),
        }
    ),
    min_size=1,
    max_size=2,
    unique_by=lambda c: str(c["id"]),
)
user_message = st.fixed_dictionaries({"role": st.just("user"), "content": nonempty_text})


@st.composite
def chat_messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A conversation OpenAI accepts: every tool call answered by a tool message right after it,
    a user message last."""
    messages: list[dict[str, Any]] = []
    for kind in draw(
        st.lists(st.sampled_from(["system", "developer", "user", "assistant", "tools"]), max_size=3)
    ):
        if kind == "tools":
            calls = draw(tool_calls)
            messages.append(
                {
                    "role": "assistant",
                    "content": draw(st.one_of(st.none(), short_text)),
                    "tool_calls": calls,
                }
            )
            messages += [
                {"role": "tool", "tool_call_id": call["id"], "content": draw(chat_content)}
                for call in calls
            ]
        else:
            message = {"role": kind, "content": draw(chat_content)}
            if draw(st.integers(0, 3)) == 0:
                message["name"] = draw(names)
            messages.append(message)
    return [*messages, draw(user_message)]


def json_schema_format(flat: bool) -> st.SearchStrategy[dict[str, Any]]:
    inner = st.fixed_dictionaries(
        {"name": names, "schema": object_schema},
        optional={"strict": st.booleans(), "description": short_text},
    )
    if flat:
        return inner.map(lambda f: {"type": "json_schema", **f})
    return inner.map(lambda f: {"type": "json_schema", "json_schema": f})


@st.composite
def tool_choice_for(draw: st.DrawFn, tools: list[dict[str, Any]], flat: bool) -> tuple[Any, bool]:
    """A tool_choice naming one of `tools`, and whether it forces a call (strict allowed)."""
    function_names = [t["function"]["name"] for t in tools]
    choice = draw(st.sampled_from(["none", "auto", "required", "named", "absent"]))
    if choice == "named":
        name = draw(st.sampled_from(function_names))
        return (
            {"type": "function", "name": name}
            if flat
            else {"type": "function", "function": {"name": name}}
        ), True
    return (None if choice == "absent" else choice), choice == "required"


@st.composite
def valid_chat(draw: st.DrawFn) -> Case:
    body: dict[str, Any] = {"model": MODEL, "messages": draw(chat_messages())}
    body.update(draw(sampling_fields()))
    budget = draw(st.sampled_from(["max_tokens", "max_completion_tokens"]))
    body[budget] = draw(small_tokens)
    tools = draw(st.one_of(st.none(), chat_tools()))
    if tools:
        body["tools"] = tools
        choice, forced = draw(tool_choice_for(tools, flat=False))
        if choice is not None:
            body["tool_choice"] = choice
        if forced and draw(st.booleans()):
            tools[0]["function"]["strict"] = True
        if draw(st.booleans()):
            body["parallel_tool_calls"] = draw(st.booleans())
    elif draw(st.booleans()):
        body["logprobs"] = True
        if draw(st.booleans()):
            body["top_logprobs"] = draw(st.integers(0, 20))
    body["response_format"] = draw(
        st.one_of(
            st.none(),
            st.just({"type": "text"}),
            st.just({"type": "json_object"}),
            json_schema_format(flat=False),
        )
    )
    if body["response_format"] is None:
        del body["response_format"]
    for name, values in (
        ("prompt_cache_key", short_text),
        ("safety_identifier", short_text),
        ("store", st.just(False)),
        ("service_tier", st.sampled_from(["auto", "default", "flex", "priority"])),
        ("priority", st.integers(-100, 100)),
    ):
        if draw(st.integers(0, 5)) == 0:
            body[name] = draw(values)
    with_stream(body, draw(st.booleans()), draw(st.one_of(st.none(), st.booleans())))
    return Case("valid", "chat", body)


completion_prompt = st.one_of(
    nonempty_text,
    st.lists(nonempty_text, min_size=1, max_size=1),
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=16),
    st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=16), min_size=1, max_size=1),
)


@st.composite
def valid_completion(draw: st.DrawFn) -> Case:
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": draw(completion_prompt),
        "max_tokens": draw(small_tokens),
    }
    body.update(draw(sampling_fields()))
    body.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "logprobs": st.one_of(st.none(), st.integers(0, 5)),
                    "echo": st.just(False),
                    "best_of": st.just(1),
                },
            )
        )
    )
    with_stream(body, draw(st.booleans()), draw(st.one_of(st.none(), st.booleans())))
    return Case("valid", "completions", body)


def input_message(role: str) -> st.SearchStrategy[dict[str, Any]]:
    part = "output_text" if role == "assistant" else "input_text"
    parts = st.lists(
        st.fixed_dictionaries({"type": st.just(part), "text": short_text}), min_size=1, max_size=2
    )
    return st.fixed_dictionaries(
        {"role": st.just(role), "content": st.one_of(short_text, parts)},
        optional={"type": st.just("message")},
    )


@st.composite
def response_items(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Input items OpenAI accepts: each function call, then its output; a user message last."""
    items: list[dict[str, Any]] = []
    for kind in draw(
        st.lists(
            st.sampled_from(["user", "system", "developer", "assistant", "call", "reasoning"]),
            max_size=3,
        )
    ):
        if kind == "call":
            call_id = draw(ids)
            items.append(
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": draw(names),
                    "arguments": draw(json_arguments),
                }
            )
            items.append(
                {"type": "function_call_output", "call_id": call_id, "output": draw(short_text)}
            )
        elif kind == "reasoning":
            items.append(
                {
                    "type": "reasoning",
                    "id": draw(st.from_regex(r"rs_[a-z0-9]{1,12}", fullmatch=True)),
                    "summary": draw(
                        st.lists(
                            st.fixed_dictionaries(
                                {"type": st.just("summary_text"), "text": short_text}
                            ),
                            max_size=2,
                        )
                    ),
                }
            )
        else:
            items.append(draw(input_message(kind)))
    return [*items, draw(input_message("user"))]


metadata = st.dictionaries(st.text(min_size=1, max_size=64), st.text(max_size=512), max_size=16)


@st.composite
def valid_response(draw: st.DrawFn) -> Case:
    body: dict[str, Any] = {
        "model": MODEL,
        "input": draw(st.one_of(nonempty_text, response_items())),
    }
    body["max_output_tokens"] = draw(small_tokens)
    body.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "instructions": short_text,
                    "metadata": metadata,
                    "temperature": number(0, 2),
                    "top_p": number(0, 1, exclude_min=True),
                    "store": st.booleans(),
                    "user": short_text,
                    "safety_identifier": short_text,
                    "prompt_cache_key": short_text,
                    "truncation": st.just("disabled"),
                    "reasoning": st.fixed_dictionaries(
                        {}, optional={"effort": st.sampled_from(["low", "medium", "high"])}
                    ),
                    "previous_response_id": st.integers(0, 1000).map(Previous),
                },
            )
        )
    )
    tools = draw(st.one_of(st.none(), chat_tools()))
    if tools:
        flat = [{"type": "function", **t["function"]} for t in tools]
        body["tools"] = flat
        choice, forced = draw(tool_choice_for(tools, flat=True))
        if choice is not None:
            body["tool_choice"] = choice
        if forced and draw(st.booleans()):
            flat[0]["strict"] = True
        if draw(st.booleans()):
            body["parallel_tool_calls"] = draw(st.booleans())
    elif draw(st.booleans()):
        body["include"] = ["message.output_text.logprobs"]
        if draw(st.booleans()):
            body["top_logprobs"] = draw(st.integers(0, 20))
    text_format = draw(
        st.one_of(
            st.none(),
            st.just({"type": "text"}),
            st.just({"type": "json_object"}),
            json_schema_format(flat=True),
        )
    )
    if text_format is not None:
        body["text"] = {"format": text_format}
    with_stream(body, draw(st.booleans()), None)
    return Case("valid", "responses", body)


def valid_case() -> st.SearchStrategy[Case]:
    return st.one_of(valid_chat(), valid_completion(), valid_response())


# -- almost valid -----------------------------------------------------------------------------
REQUIRED = {
    "chat": ("model", "messages"),
    "completions": ("model", "prompt"),
    "responses": ("model", "input"),
}
_SAMPLING_RANGE: dict[str, list[Any]] = {
    "temperature": [-0.5, 2.5, 3],
    "top_p": [0, -0.1, 1.01, 2],
    "top_k": [-1, -100],
    "min_p": [-0.1, 1.5],
    "presence_penalty": [-2.01, 2.5],
    "frequency_penalty": [-3, 2.01],
    "repetition_penalty": [0, -1],
    "max_tokens": [0, -1],
    "n": [0, 2, -1],
    "stop": [[""], ["a", "b", "c", "d", "e"], ""],
    "logit_bias": [{"1": 101}, {"1": -100.5}, {str(VOCAB): 1}, {"-1": 1}, {"abc": 1}],
}
OUT_OF_RANGE: dict[str, dict[str, list[Any]]] = {
    "chat": {
        **_SAMPLING_RANGE,
        "top_logprobs": [-1, 21],
        "max_completion_tokens": [0, -5],
        "messages": [[]],
        "tool_choice": ["required", {"type": "function", "function": {"name": "nope"}}],
        "response_format": [{"type": "json_schema"}, {"type": "nope"}],
        "logprobs": [None],
        "parallel_tool_calls": [None],
    },
    "completions": {
        **_SAMPLING_RANGE,
        "logprobs": [-1, 6],
        "prompt": ["", [], [[]], [VOCAB], [-1]],
        "best_of": [2],
        "echo": [True],
        "suffix": ["x"],
    },
    "responses": {
        "temperature": [-0.5, 2.5],
        "top_p": [0, 1.01],
        "max_output_tokens": [0, -1],
        "top_logprobs": [-1, 21],
        "input": ["", []],
        "truncation": ["auto"],
        "include": [["file_search_call.results"]],
        "metadata": [{str(i): "v" for i in range(17)}, {"k": "v" * 513}, {"k" * 65: "v"}],
        "text": [{"format": {"type": "json_schema", "name": "x"}}, {"format": {"type": "nope"}}],
        "tool_choice": ["required", {"type": "function", "name": "nope"}],
        "previous_response_id": ["resp_doesnotexist"],
    },
}
json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10), st.floats(-1e3, 1e3), short_text
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(short_text, inner, max_size=3)
    ),
    max_leaves=6,
)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def slots(value: Any, path: str = "") -> Iterator[tuple[Any, Any, str]]:
    """Every (container, key, path) in a JSON value, depth first."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            yield value, key, where
            yield from slots(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield value, index, f"{path}[{index}]"
            yield from slots(item, f"{path}[{index}]")


@st.composite
def almost_valid_case(draw: st.DrawFn) -> Case:
    case = draw(valid_case())
    body = copy.deepcopy(case.body)
    places = list(slots(body))
    kind = draw(
        st.sampled_from(
            ["drop_required", "drop", "unknown", "retype", "retype", "range", "range", "model"]
        )
    )
    if kind == "drop_required":
        name = draw(st.sampled_from(REQUIRED[case.endpoint]))
        del body[name]
        note = f"without {name}"
    elif kind == "drop":
        container, key, where = draw(st.sampled_from(places))
        del container[key]
        note = f"without {where}"
    elif kind == "unknown":
        dicts = [body, *(c[k] for c, k, _ in places if isinstance(c[k], dict))]
        target = draw(st.sampled_from(dicts))
        name = draw(st.one_of(names, st.text(max_size=12)).filter(lambda n: n not in target))
        target[name] = draw(json_value)
        note = f"unknown field {name!r}"
    elif kind == "retype":
        container, key, where = draw(st.sampled_from(places))
        old = _kind(container[key])
        container[key] = draw(json_value.filter(lambda v: _kind(v) != old))
        note = f"{where} retyped from {old}"
    elif kind == "range":
        table = OUT_OF_RANGE[case.endpoint]
        name = draw(st.sampled_from(sorted(table)))
        body[name] = draw(st.sampled_from(table[name]))
        if name == "top_logprobs" and case.endpoint == "chat":
            body["logprobs"] = True
        note = f"{name} out of range"
    else:
        body["model"] = draw(st.sampled_from(["gpt-4o", "", "TINY", "tiny ", "../tiny"]))
        note = "unknown model"
    return attrs.evolve(case, flavour="almost", body=body, note=note)


# -- hostile ----------------------------------------------------------------------------------
def deep(depth: int, kind: str = "list") -> Raw:
    if kind == "list":
        return Raw("[" * depth + "]" * depth)
    return Raw('{"a":' * depth + "1" + "}" * depth)


HUGE_NUMBERS = [
    Raw("9" * 5000),
    Raw("-" + "9" * 5000),
    Raw("1e999"),
    Raw("-1e999"),
    Raw("NaN"),
    Raw("Infinity"),
    Raw("-Infinity"),
    Raw("1" + "0" * 400 + ".5"),
    Raw("1e-400"),
    Raw("-0"),
    2**64,
    2**63,
    -(2**63) - 1,
    2**31,
    -1,
    1.5,
    1e308,
]
SURROGATES = ["\ud800", "a\udfffb", "\udc80" * 8, "x\ud83d"]
ODD_STRINGS = [
    "\x00",
    "\u2028\u2029",
    "\ufeff",
    "\ufffe\uffff",
    "١٢٣",
    "²",
    "Ⅻ",
    "<|im_start|>system\n",
    "<|im_end|>",
    '<tool_call>{"name":',
    "{{ raise_exception('x') }}",
    "%s%n",
    "../../etc/passwd",
]
ODD_DIGIT_KEYS = [
    "²",
    "١٢",
    "①",
    "٣",
    "𝟙",
    "߁",
    " 1",
    "1 ",
    "+1",
    "-1",
    "1.0",
    "",
    "0x1",
    "1e3",
    "99999999999999999999999999",
    str(VOCAB),
    "\ud800",
    "١" * 5000,
    "0" * 5000 + "1",
]
ODD_TOOL_CHOICES: list[Any] = [
    {"type": "function", "function": "f"},
    {"type": "function"},
    {"type": "function", "function": {}},
    {"type": "function", "function": {"name": 5}},
    {"type": "function", "name": "nope"},
    {"type": "function", "function": {"name": "f"}, "name": "f"},
    {"type": "function", "name": {"x": 1}},
    {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]},
    {"type": "file_search"},
    {"type": "custom", "name": "f"},
    {"type": "mcp"},
    {"type": None},
    {"function": {"name": "f"}},
    [],
    ["auto"],
    5,
    "",
    "REQUIRED",
    "function",
    None,
    {"type": "function", "function": {"name": "\ud800"}},
]
HOSTILE_SCHEMAS: list[Any] = [
    deep(2000, "object"),
    {"$ref": "#"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "string", "pattern": "(a+)+$"},
    {"type": "string", "pattern": "["},
    {"type": "array", "minItems": 100000},
    {"type": "string", "minLength": 10**9},
    {"type": "integer", "minimum": Raw("1e999")},
    {"enum": list(range(5000))},
    {"type": "object", "properties": {str(i): {"type": "string"} for i in range(500)}},
    {"anyOf": [{"type": "string"}] * 300},
    {"type": ["string", 5]},
    {"type": "nope"},
    [],
    "x",
    True,
    {
        "type": "object",
        "properties": {"a": {"type": "string", "format": "date-time", "pattern": "^\\d{1,1000}$"}},
    },
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"not": {}},
]


def huge_strings(max_bytes: int) -> st.SearchStrategy[str]:
    sizes = [n for n in (10_000, 100_000, 300_000, 2_000_000, 9_000_000) if n <= max_bytes] or [
        max_bytes
    ]
    return st.tuples(
        st.sampled_from(sizes), st.sampled_from(["a", "€", "🙂 ", "hello world ", "\ud800"])
    ).map(lambda p: (p[1] * (p[0] // len(p[1].encode("utf-8", "surrogatepass"))))[: p[0]])


def hostile_values(max_bytes: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(
            [deep(1000), deep(5000), deep(100_000), deep(1000, "object"), deep(20_000, "object")]
        ),
        st.sampled_from(HUGE_NUMBERS),
        st.sampled_from(SURROGATES + ODD_STRINGS),
        huge_strings(max_bytes),
        st.sampled_from(
            [[1] * 100_000, [{}] * 10_000, ["x"] * 10_000, {str(i): i for i in range(10_000)}]
        ),
        st.sampled_from([True, None, "", [], {}, [[]], {"": None}, 0]),
    )


@st.composite
def targeted(draw: st.DrawFn, endpoint: str, max_bytes: int) -> tuple[dict[str, Any], str]:
    """Fields that have broken servers: each a (fields to set, note)."""
    budget = "max_output_tokens" if endpoint == "responses" else "max_tokens"
    options: list[tuple[dict[str, Any], str]] = [
        (
            {
                "temperature": draw(
                    st.sampled_from([Raw("NaN"), Raw("1e999"), 1e308, -0.0, 5e-324])
                ),
                "top_p": draw(st.sampled_from([1, 5e-324, Raw("NaN")])),
            },
            "temperature/top_p",
        ),
        ({budget: draw(st.sampled_from([2**31, 2**63, 10**30, Raw("9" * 5000), 10**9]))}, "budget"),
        (
            {
                "tool_choice": draw(st.sampled_from(ODD_TOOL_CHOICES)),
                "tools": draw(
                    st.sampled_from(
                        [None, [{"type": "function", "function": {"name": "f"}, "name": "f"}]]
                    )
                ),
            },
            "tool_choice shape",
        ),
        ({"user": draw(st.sampled_from(SURROGATES)), "stream": True}, "user surrogate"),
        ({"model": draw(st.sampled_from(["\ud800", "a" * 10_000, "tiny\x00"]))}, "model"),
        (
            {
                "stream": draw(st.sampled_from(["true", 1, Raw("NaN")])),
                "stream_options": draw(
                    st.sampled_from([{"include_usage": "yes"}, [], {"include_obfuscation": True}])
                ),
            },
            "stream flags",
        ),
    ]
    if endpoint != "responses":
        options += [
            (
                {
                    "seed": draw(
                        st.sampled_from(
                            [
                                -1,
                                2**64,
                                2**63,
                                -(2**63),
                                -(2**63) - 1,
                                2**64 - 1,
                                Raw("9" * 5000),
                                Raw("-1.0"),
                                Raw("1e20"),
                            ]
                        )
                    )
                },
                "seed",
            ),
            (
                {
                    "top_k": draw(
                        st.sampled_from([VOCAB, VOCAB + 1, 4096, 2**31, 2**63 - 1, 2**63, 10**30])
                    ),
                    "temperature": draw(st.sampled_from([0, 1])),
                },
                "top_k",
            ),
            ({"logit_bias": {draw(st.sampled_from(ODD_DIGIT_KEYS)): 1}}, "logit_bias key"),
            (
                {
                    "logit_bias": {
                        "1": draw(
                            st.sampled_from([Raw("NaN"), Raw("Infinity"), 1e308, -101, "1", None])
                        )
                    }
                },
                "logit_bias value",
            ),
            (
                {
                    "stop": draw(
                        st.sampled_from([["\ud800"], ["a" * 100_000], "\ud800", [""] * 4, 5])
                    )
                },
                "stop",
            ),
        ]
    if endpoint == "chat":
        schema = draw(st.sampled_from(HOSTILE_SCHEMAS))
        options += [
            (
                {"messages": [{"role": "user", "content": draw(hostile_values(max_bytes))}]},
                "content",
            ),
            (
                {
                    "messages": [
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "c",
                                    "type": "function",
                                    "function": {
                                        "name": "f",
                                        "arguments": draw(
                                            st.sampled_from(
                                                [
                                                    "[" * 5000 + "]" * 5000,
                                                    '{"a":' * 1000 + "1" + "}" * 1000,
                                                    "\ud800",
                                                    "NaN",
                                                    "1e999",
                                                    "9" * 5000,
                                                ]
                                            )
                                        ),
                                    },
                                }
                            ],
                        },
                        {"role": "user", "content": "hi"},
                    ]
                },
                "tool call arguments",
            ),
            (
                {
                    "messages": [{"role": "user", "content": "hi"}]
                    * draw(st.sampled_from([2000, 20_000]))
                },
                "many messages",
            ),
            (
                {
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "x"}] * 20_000}
                    ]
                },
                "many parts",
            ),
            (
                {
                    "messages": [
                        {
                            "role": draw(st.sampled_from(["\ud800", "function", "", "USER"])),
                            "content": "x",
                        }
                    ]
                },
                "role",
            ),
            (
                {
                    "tools": [
                        {"type": "function", "function": {"name": "f", "parameters": schema}}
                    ],
                    "tool_choice": draw(
                        st.sampled_from(
                            ["required", "auto", {"type": "function", "function": {"name": "f"}}]
                        )
                    ),
                },
                "tool parameters",
            ),
            (
                {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": schema, "strict": True},
                    }
                },
                "response schema",
            ),
            (
                {
                    "logprobs": True,
                    "top_logprobs": draw(st.sampled_from([2**64, 21, -1, Raw("1e999")])),
                },
                "top_logprobs",
            ),
            (
                {
                    "messages": [
                        {"role": "user", "content": "hi", "name": draw(st.sampled_from(SURROGATES))}
                    ]
                },
                "name",
            ),
        ]
    elif endpoint == "completions":
        options += [
            (
                {
                    "prompt": draw(
                        st.sampled_from(
                            [
                                *SURROGATES,
                                ["\ud800"],
                                [VOCAB],
                                [-1],
                                [2**63],
                                [[]],
                                [],
                                [[1, 2], [3]],
                                [1.5],
                                [True],
                                deep(5000),
                                [0] * 100_000,
                                [Raw("9" * 5000)],
                                [[VOCAB]],
                            ]
                        )
                    )
                },
                "prompt",
            ),
            ({"prompt": draw(huge_strings(max_bytes))}, "huge prompt"),
            ({"logprobs": draw(st.sampled_from([6, -1, 2**64, True, Raw("NaN")]))}, "logprobs"),
            ({"echo": True, "logprobs": 5}, "echo"),
            ({"suffix": "\ud800"}, "suffix"),
            ({"best_of": 2**64}, "best_of"),
        ]
    else:
        schema = draw(st.sampled_from(HOSTILE_SCHEMAS))
        options += [
            (
                {
                    "input": draw(
                        st.sampled_from(
                            [
                                deep(5000),
                                [],
                                [{}],
                                [5],
                                ["x"],
                                [{"type": "reasoning", "summary": "x"}],
                                [{"type": "reasoning", "summary": [1]}],
                                [{"type": "reasoning", "summary": [{"text": 5}]}],
                                [{"type": "reasoning", "summary": [{"type": "summary_text"}]}],
                                [{"type": "reasoning", "summary": None, "content": "x"}],
                                [{"type": "reasoning", "summary": [], "content": [{"text": None}]}],
                                [
                                    {
                                        "type": "function_call",
                                        "call_id": "c",
                                        "name": "f",
                                        "arguments": "[" * 5000 + "]" * 5000,
                                    }
                                ],
                                [{"type": "function_call_output", "call_id": "c", "output": ["x"]}],
                                [
                                    {
                                        "type": "function_call_output",
                                        "call_id": "c",
                                        "output": [{"type": "input_text", "text": "x"}],
                                    }
                                ],
                                [{"type": "item_reference", "id": "x"}],
                                [{"role": "tool", "content": "x"}],
                                [
                                    {
                                        "type": "message",
                                        "role": "user",
                                        "content": [{"type": "input_image", "image_url": "x"}],
                                    }
                                ],
                                [
                                    {
                                        "type": "message",
                                        "role": "user",
                                        "content": [{"type": "input_text", "text": "\ud800"}],
                                    }
                                ],
                                [{"role": "user", "content": [{"type": "input_text"}]}],
                                [{"role": "user", "content": "x", "id": deep(3000)}],
                            ]
                        )
                    )
                },
                "input",
            ),
            ({"input": draw(huge_strings(max_bytes))}, "huge input"),
            (
                {
                    "previous_response_id": draw(
                        st.sampled_from(
                            [*SURROGATES, "resp_" + "a" * 100_000, "", "../x", "resp_\x00", 5, []]
                        )
                    )
                },
                "previous_response_id",
            ),
            (
                {
                    "metadata": draw(
                        st.sampled_from(
                            [
                                {"k": "\ud800"},
                                {"\ud800": "v"},
                                {"k": "v" * 10_000},
                                {"k": 1},
                                [],
                                {"k": deep(2000)},
                            ]
                        )
                    ),
                    "stream": draw(st.booleans()),
                },
                "metadata",
            ),
            ({"instructions": draw(st.sampled_from([*SURROGATES, deep(2000)]))}, "instructions"),
            (
                {
                    "text": draw(
                        st.sampled_from(
                            [
                                {"format": {"type": "json_schema", "name": "x", "schema": schema}},
                                {"format": {"type": "json_schema"}},
                                {"format": "json"},
                                {"format": {"type": "json_object"}, "verbosity": "high"},
                                "x",
                            ]
                        )
                    )
                },
                "text.format",
            ),
            (
                {
                    "tools": draw(
                        st.sampled_from(
                            [
                                [{"type": "function"}],
                                [{"type": "function", "name": ""}],
                                [{"type": "web_search"}],
                                [5],
                                [{"type": "function", "name": "f", "parameters": schema}],
                            ]
                        )
                    ),
                    "tool_choice": draw(
                        st.sampled_from(["auto", "required", {"type": "function", "name": "f"}])
                    ),
                },
                "tools",
            ),
            (
                {
                    "reasoning": draw(
                        st.sampled_from(
                            [{"effort": "\ud800"}, "x", {"summary": 5}, {"effort": "max"}]
                        )
                    )
                },
                "reasoning",
            ),
            (
                {
                    "include": draw(
                        st.sampled_from([["\ud800"], ["message.output_text.logprobs", 5], "x"])
                    ),
                    "top_logprobs": draw(st.sampled_from([2**64, -1, 21, 5])),
                },
                "include",
            ),
        ]
    chosen: tuple[dict[str, Any], str] = draw(st.sampled_from(options))
    return chosen


NOT_JSON = [
    b"",
    b"{",
    b"}",
    b"null",
    b"[]",
    b"1",
    b'"x"',
    b"true",
    b"\xff\xfe{}",
    b"\x00" * 100,
    b"{} x",
    b"{}{}",
    b"model=tiny&prompt=hi",
    b'{"model": "tiny", "prompt": "hi", "max_tokens": NaN}',
    b'{"a": "\\ud800"',
    b"\xed\xa0\x80",
    b'{"model": "\xff"}',
    b'{"model":"tiny","prompt":"\\uZZZZ"}',
]
CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
    None,
    "application/json; charset=utf-16",
    "application/json; charset=latin-1",
    "APPLICATION/JSON",
    "application/json;;;",
    "application/jsonx",
    "*/*",
    'application/json; x="',
    "application/merge-patch+json",
    "text/event-stream",
]


@st.composite
def transport_case(draw: st.DrawFn, endpoint: str, body: dict[str, Any], max_bytes: int) -> Case:
    kind = draw(
        st.sampled_from(
            ["not_json", "content_type", "encoding", "headers", "method", "big_body", "attack"]
        )
    )
    if kind == "attack":
        return draw(attack_case(endpoint, body))
    text = encode(body, [])
    if kind == "not_json":
        raw = draw(st.one_of(st.sampled_from(NOT_JSON), st.binary(max_size=64)))
        return Case("hostile", endpoint, raw, note="not JSON")
    if kind == "content_type":
        return Case(
            "hostile",
            endpoint,
            body,
            content_type=draw(st.sampled_from(CONTENT_TYPES)),
            note="content type",
        )
    if kind == "encoding":
        raw = draw(
            st.sampled_from(
                [
                    b"\xef\xbb\xbf" + text.encode(),
                    text.encode("utf-16"),
                    text.encode("utf-32"),
                    text.replace('"model"', '"model":"x","model"', 1).encode(),
                    text.encode() + b"\x00",
                    text.encode()[:-1],
                ]
            )
        )
        return Case("hostile", endpoint, raw, note="encoding")
    if kind == "headers":
        size = draw(st.sampled_from([100, 10_000, 20_000, MAX_HEAD_BYTES - 2000]))
        headers = draw(
            st.sampled_from(
                [
                    (("x-request-id", "r" * size),),
                    (("x-pad", "p" * size),),
                    tuple((f"x-h{i}", "v" * (size // 200)) for i in range(200)),
                    (("x-request-id", "\x7f\x80é"),),
                ]
            )
        )
        return Case("hostile", endpoint, body, headers=headers, note="headers")
    if kind == "method":
        method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]))
        return Case(
            "hostile", endpoint, body if method != "GET" else None, method=method, note="method"
        )
    size = draw(st.sampled_from([n for n in (1 << 20, 9 << 20) if n <= max_bytes] or [max_bytes]))
    padded = dict(body, pad="x" * size)
    return Case("hostile", endpoint, padded, note="big body")


@st.composite
def attack_case(draw: st.DrawFn, endpoint: str, body: dict[str, Any]) -> Case:
    """The security review's attacks that fit one request (issue 30): each must be refused
    in the envelope or served, never a 5xx, and must not stall the health probe."""
    attack = draw(st.sampled_from(["reasoning_items", "form_audio", "forged_id", "private_image"]))
    if attack == "reasoning_items":  # once quadratic to prepare
        count = draw(st.sampled_from([1_500, 5_000]))
        items = [{"type": "reasoning", "id": f"rs_{i}", "summary": []} for i in range(count)]
        return Case("hostile", "responses", {"model": MODEL, "input": items}, note="items")
    if attack == "form_audio":  # once parsed on the Trio thread with no field cap
        size = draw(st.sampled_from([16, 1 << 20]))
        return Case(
            "hostile",
            "other",
            b"model=tiny&file=" + b"x" * size,
            path="/v1/audio/transcriptions",
            content_type="application/x-www-form-urlencoded",
            note="urlencoded audio",
        )
    if attack == "forged_id":  # once able to forge fields in text logs
        forged = draw(st.sampled_from(["a status=200 model=x", "id with spaces", "x" * 129]))
        return Case("hostile", endpoint, body, headers=(("x-request-id", forged),), note="id")
    url = draw(st.sampled_from(["http://127.0.0.1:9/x.png", "http://169.254.169.254/latest"]))
    image = {"type": "image_url", "image_url": {"url": url}}
    chat = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [image]}]}
    return Case("hostile", "chat", chat, note="image from a private address")


OTHER_PATHS = [
    ("POST", "/v1/models/%0atiny/load"),
    ("POST", "/v1/models/tiny%0a/unload"),
    ("GET", "/v1/responses/%ED%A0%80"),
    ("GET", "/v1/responses/%FF"),
    ("GET", "/v1/responses/resp_x?stream=true"),
    ("GET", "/v1/responses/x/input_items?limit=abc"),
    ("GET", "/v1/responses/x/input_items?limit=999999999999999999999"),
    ("GET", "/v1/responses/x/input_items?order=sideways&after=%ED%A0%80"),
    ("DELETE", "/v1/responses/%ED%A0%80"),
    ("GET", "/v1/models/%00"),
    ("GET", "/v1/models/%ED%A0%80"),
    ("POST", "/v1/chat/completions/"),
    ("POST", "/v1//chat/completions"),
    ("GET", "/%2e%2e/%2e%2e/etc/passwd"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/responses/" + "a" * 20_000),
    ("GET", "/health?x=" + "a" * 10_000),
    ("POST", "/v1/chat/completions?" + "a" * 20_000),
    ("GET", "/v1/models/" + "a" * (MAX_HEAD_BYTES - 1000)),
    ("GET", "/v1/responses/{stored}"),
    ("GET", "/v1/responses/{stored}/input_items?limit=100&order=asc"),
    ("GET", "/v1/responses/{stored}/input_items?limit=0"),
    ("GET", "/v1/responses/{stored}/input_items?include=x"),
    ("GET", "/v1/responses/{stored}/input_items?after=%ED%A0%80"),
]


@st.composite
def hostile_case(draw: st.DrawFn, max_bytes: int = MAX_BYTES) -> Case:
    base = draw(valid_case())
    body = copy.deepcopy(base.body)
    kind = draw(
        st.sampled_from(["inject", "targeted", "targeted", "targeted", "transport", "path"])
    )
    if kind == "transport":
        return draw(transport_case(base.endpoint, body, max_bytes))
    if kind == "path":
        method, path = draw(st.sampled_from(OTHER_PATHS))
        return Case(
            "hostile", "other", body if method == "POST" else None, method=method, path=path
        )
    if kind == "inject":
        container, key, where = draw(st.sampled_from(list(slots(body))))
        value = draw(hostile_values(max_bytes))
        container[key] = value
        note = f"{where} = {value!r:.60}"
    else:
        fields, note = draw(targeted(base.endpoint, max_bytes))
        body.update({k: v for k, v in fields.items() if v is not None})
        if fields.get("tools", 0) is None:
            body.pop("tools", None)
        if draw(st.booleans()):
            body["stream"] = True
    return Case("hostile", base.endpoint, body, ascii=draw(st.booleans()), note=note)


# -- outcomes ---------------------------------------------------------------------------------
KINDS = (
    "5xx",
    "envelope",
    "stream",
    "in_stream_5xx",
    "schema",
    "health",
    "transport",
    "hang",
    "rejected",
)
"""What can go wrong with one case; `rejected` is a valid request refused."""
RETRYABLE = {
    "server_overloaded",
    "server_unavailable",
    "engine_unavailable",
    "server_shutting_down",
    "model_loading",
    "request_timeout",
}
SERVER_FAILURES = {"internal_error", "generation_failed", "server_error"}
TERMINAL_RESPONSE_EVENTS = {"response.completed", "response.incomplete", "response.failed", "error"}


@attrs.define
class Outcome:
    case: Case
    status: int | None = None
    problems: list[tuple[str, str]] = attrs.field(factory=list)
    error_code: str | None = None
    """The envelope's code, or the in-stream error's."""
    health: int | None = None
    elapsed: float = 0.0
    """Seconds from sending the request to the end of its reply (the health check excluded)."""
    request_id: str | None = None
    """The server's x-request-id: its log names the request by it."""

    def add(self, kind: str, detail: str) -> None:
        self.problems.append((kind, _short(detail, 400)))

    def of(self, kind: str) -> list[str]:
        return [detail for k, detail in self.problems if k == kind]

    def report(self) -> str:
        return f"{self.case.describe()}\n  -> {self.status}: {self.problems}"


@cache
def _event_schemas() -> dict[str, str]:
    """Responses stream event type -> its schema's name in the spec."""
    spec = openapi_spec()["components"]["schemas"]
    names = [ref["$ref"].rsplit("/", 1)[1] for ref in spec["ResponseStreamEvent"]["anyOf"]]
    return {spec[name]["properties"]["type"]["enum"][0]: name for name in names}


def _schema_problem(outcome: Outcome, instance: Any, schema: str) -> None:
    try:
        validate(instance, schema)
    except AssertionError as exc:
        outcome.add("schema", f"{schema}: {exc}")


def _as_final(chunk: Any) -> Any:
    """A streamed completions chunk, checked against the spec's one completions schema: OpenAI
    streams `finish_reason: null` until the last chunk, and `usage: null` on every chunk but the
    last when usage was asked for, which that schema (written for the whole body) does not allow."""
    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
        return chunk
    choices = [
        dict(c, finish_reason=c.get("finish_reason") or "length") if isinstance(c, dict) else c
        for c in chunk["choices"]
    ]
    final = {**chunk, "choices": choices}
    if "usage" in final and final["usage"] is None:
        del final["usage"]
    return final


class Judge:
    """The checks of one reply; keeps the ids of the responses the server stored."""

    def __init__(self) -> None:
        self.stored: list[str] = []

    def judge(self, outcome: Outcome, reply: httpx.Response, raw: bytes) -> None:
        """Check one complete reply (`raw`, its whole body) against what `outcome.case` asked."""
        status, case = reply.status_code, outcome.case
        content_type = reply.headers.get("content-type", "")
        outcome.status = status
        outcome.request_id = reply.headers.get("x-request-id")
        if status >= 500 and status not in (503, 504):
            outcome.add("5xx", f"{status}: {raw[:300]!r}")
        if status >= 300:
            self._judge_error(outcome, raw)
            if case.flavour == "valid" and status not in (503, 504):
                outcome.add("rejected", f"{status}: {raw[:300]!r}")
            return
        if content_type.startswith("text/event-stream"):
            if case.endpoint in ("chat", "completions") and case.json_body and not case.stream:
                outcome.add("stream", "a stream for a request that did not ask for one")
            events = self._sse(outcome, raw)
            if events is not None:
                if case.endpoint == "responses":
                    self._judge_response_stream(outcome, events)
                else:
                    self._judge_chunk_stream(outcome, events)
            return
        if case.stream and case.endpoint != "other":
            outcome.add("stream", f"asked for a stream, got {status} {content_type}")
        if not raw:
            return
        try:
            body = json.loads(raw)
        except ValueError as exc:
            outcome.add("schema", f"a {status} body that is not JSON ({exc}): {raw[:200]!r}")
            return
        schema = {
            "chat": "CreateChatCompletionResponse",
            "completions": "CreateCompletionResponse",
            "responses": "Response",
        }.get(case.endpoint)
        if schema is not None and case.method == "POST":
            _schema_problem(outcome, body, schema)
            if (
                case.endpoint == "responses"
                and body.get("store") is not False
                and isinstance(body.get("id"), str)
            ):
                self.stored.append(body["id"])

    def _judge_error(self, outcome: Outcome, raw: bytes) -> None:
        if len(raw) > MAX_ERROR_BODY:
            outcome.add("envelope", f"an error body of {len(raw)} bytes")
        try:
            body = json.loads(raw)
            validate_error(body)
            outcome.error_code = body["error"]["code"]
        except (ValueError, AssertionError, TypeError, KeyError) as exc:
            outcome.add(
                "envelope", f"not OpenAI's error envelope ({type(exc).__name__}): {raw[:300]!r}"
            )

    def _sse(self, outcome: Outcome, raw: bytes) -> list[tuple[str | None, Any]] | None:
        """(event name, data) per event; None (with a problem) when the framing is broken."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            outcome.add("stream", f"the stream is not UTF-8: {exc}")
            return None
        if not text.endswith("\n\n"):
            outcome.add("stream", f"the stream ends mid-event: ...{text[-200:]!r}")
            return None
        events: list[tuple[str | None, Any]] = []
        for block in text[:-2].split("\n\n"):
            name, data = None, []
            for line in block.split("\n"):
                field, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if field == "event":
                    name = value
                elif field == "data":
                    data.append(value)
                elif field:
                    outcome.add("stream", f"an SSE line of an unknown field: {line[:100]!r}")
            payload = "\n".join(data)
            try:
                events.append((name, payload if payload == "[DONE]" else json.loads(payload)))
            except ValueError as exc:
                outcome.add("stream", f"an event that is not JSON ({exc}): {payload[:200]!r}")
                return None
        return events

    def _stream_error(self, outcome: Outcome, code: str | None, where: str) -> None:
        outcome.error_code = code
        if code in SERVER_FAILURES:
            outcome.add("in_stream_5xx", f"{where}: {code}")
        elif outcome.case.flavour == "valid" and code not in RETRYABLE:
            outcome.add("rejected", f"{where}: {code}")

    def _judge_chunk_stream(self, outcome: Outcome, events: list[tuple[str | None, Any]]) -> None:
        payloads = [data for _, data in events]
        schema = (
            "CreateChatCompletionStreamResponse"
            if outcome.case.endpoint == "chat"
            else "CreateCompletionResponse"
        )
        if not payloads:
            outcome.add("stream", "an empty stream")
            return
        last = payloads[-1]
        if isinstance(last, dict) and "error" in last:
            try:
                validate_error(last)
            except AssertionError as exc:
                outcome.add("stream", f"an error event not in the envelope: {exc}")
            self._stream_error(outcome, (last.get("error") or {}).get("code"), "error event")
            chunks = payloads[:-1]
        elif last == "[DONE]":
            chunks = payloads[:-1]
            if not any(
                isinstance(c, dict) and any(ch.get("finish_reason") for ch in c.get("choices", []))
                for c in chunks
            ):
                outcome.add("stream", "[DONE] without a chunk carrying a finish_reason")
        else:
            outcome.add("stream", f"no terminal event; the last is {str(last)[:200]}")
            chunks = payloads
        for chunk in chunks:
            if chunk == "[DONE]" or (isinstance(chunk, dict) and "error" in chunk):
                outcome.add("stream", f"a terminal event before the end: {str(chunk)[:200]}")
            elif not outcome.of("schema"):
                _schema_problem(
                    outcome,
                    _as_final(chunk) if schema == "CreateCompletionResponse" else chunk,
                    schema,
                )

    def _judge_response_stream(
        self, outcome: Outcome, events: list[tuple[str | None, Any]]
    ) -> None:
        if not events:
            outcome.add("stream", "an empty stream")
            return
        schemas = _event_schemas()
        numbers = []
        for name, event in events:
            if not isinstance(event, dict):
                outcome.add("stream", f"an event that is not an object: {str(event)[:100]}")
                return
            kind = event.get("type")
            if name != kind:
                outcome.add("stream", f"event name {name!r} for an event of type {kind!r}")
            numbers.append(event.get("sequence_number"))
            if kind not in schemas:
                outcome.add("schema", f"unknown event type {kind!r}")
            elif not outcome.of("schema"):
                _schema_problem(outcome, event, schemas[kind])
        if numbers != list(range(len(numbers))):
            outcome.add("stream", f"sequence numbers {numbers[:10]}... are not 0, 1, 2, ...")
        kinds = [event.get("type") for _, event in events]
        if kinds[0] != "response.created":
            outcome.add("stream", f"the first event is {kinds[0]!r}")
        if kinds[-1] not in TERMINAL_RESPONSE_EVENTS:
            outcome.add("stream", f"no terminal event; the last is {kinds[-1]!r}")
        if any(k in TERMINAL_RESPONSE_EVENTS for k in kinds[:-1]):
            outcome.add("stream", f"a terminal event before the end: {kinds}")
        final = events[-1][1]
        if kinds[-1] == "error":
            self._stream_error(outcome, final.get("code"), "error event")
        elif kinds[-1] == "response.failed":
            self._stream_error(
                outcome,
                ((final.get("response") or {}).get("error") or {}).get("code"),
                "response.failed",
            )
        elif kinds[-1] in ("response.completed", "response.incomplete"):
            response = final.get("response") or {}
            if response.get("store") is not False and isinstance(response.get("id"), str):
                self.stored.append(response["id"])


class Target(Judge):
    """A server to send cases to, one at a time, over one keep-alive connection."""

    def __init__(self, base_url: str) -> None:
        super().__init__()
        self.base_url = base_url
        self.client = httpx.Client(
            base_url=base_url, timeout=httpx.Timeout(READ_TIMEOUT, connect=10.0)
        )

    def close(self) -> None:
        self.client.close()

    def health(self, outcome: Outcome | None = None) -> int | None:
        """/health on the connection the case used; if that fails, on a new one (a dropped
        keep-alive connection is a transport problem, not a dead server)."""
        try:
            return self.client.get("/health", timeout=30.0).status_code
        except httpx.HTTPError as exc:
            if outcome is not None:
                outcome.add(
                    "transport",
                    f"/health on the connection after the reply: {type(exc).__name__}: {exc}",
                )
        try:
            with httpx.Client(base_url=self.base_url, timeout=30.0) as fresh:
                return fresh.get("/health").status_code
        except httpx.HTTPError:
            return None

    def run(self, case: Case) -> Outcome:
        outcome = Outcome(case)
        headers = {
            name.encode(): value.encode("latin-1") for name, value in case.headers
        }  # sent as they are
        if case.content_type is not None:
            headers[b"content-type"] = case.content_type.encode("latin-1")
        path = case.url.replace("{stored}", self.stored[-1] if self.stored else "resp_none")
        started = time.monotonic()
        reply: httpx.Response | None = None
        raw = b""
        try:
            with self.client.stream(
                case.method, path, content=case.payload(self.stored), headers=headers
            ) as reply:
                outcome.status = reply.status_code
                chunks: list[bytes] = []
                for chunk in reply.iter_raw():
                    chunks.append(chunk)
                    if time.monotonic() - started > CASE_DEADLINE:
                        outcome.add("hang", f"the reply was still coming after {CASE_DEADLINE} s")
                        reply = None
                        break
                raw = b"".join(chunks)
        except httpx.TimeoutException as exc:
            outcome.add("hang", f"{type(exc).__name__} after {time.monotonic() - started:.1f} s")
            reply = None
        except httpx.HTTPError as exc:
            outcome.add("transport", f"{type(exc).__name__}: {exc}")
            reply = None
        outcome.elapsed = time.monotonic() - started
        # At once, on the same connection: a server that closes a keep-alive connection after its
        # reply without saying so (`Connection: close`) fails the client's next request on it.
        outcome.health = self.health(outcome)
        if outcome.health != 200:
            outcome.add("health", f"/health answered {outcome.health} after the case")
        if reply is not None:
            self.judge(outcome, reply, raw)
        return outcome


# -- the server, in a thread of its own -------------------------------------------------------
class ServerThread:
    """`running_server` in a background thread with its own `trio.run`, for sync tests."""

    def __init__(self, model: Path, **server_settings: Any) -> None:
        self._model = model
        self._settings = server_settings
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self.base_url = ""
        self.running: Any = None
        self.restarts = 0

    def start(self) -> None:
        ready = threading.Event()
        self._error = None

        async def serve() -> None:
            self._stop = trio.Event()
            async with running_server(self._model, **self._settings) as running:
                self.running, self.base_url = running, running.base_url
                self._token = trio.lowlevel.current_trio_token()
                ready.set()
                await self._stop.wait()

        def main() -> None:
            try:
                trio.run(serve)
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                self._error = exc
            finally:
                ready.set()

        self._thread = threading.Thread(target=main, name="fuzz-server", daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            raise RuntimeError("the fuzz server did not start") from self._error

    def stop(self, timeout: float = 60.0) -> None:
        """Shut down as SIGTERM would; raise if the thread does not end or ended with an error."""
        assert self._thread is not None and self._token is not None and self._stop is not None
        stop = self._stop
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(stop.set)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the server thread did not stop within {timeout} s"
        if self._error is not None:
            raise AssertionError("the server ended with an error") from self._error

    def restart(self) -> None:
        self.restarts += 1
        try:
            self.stop()
        finally:
            self.start()


class Fuzz:
    """Runs cases against a `ServerThread`, restarting it after a case that left it unhealthy,
    so that each case is judged on a healthy server."""

    def __init__(self, server: ServerThread) -> None:
        self.server = server
        self.target = Target(server.base_url)

    def run(self, case: Case) -> Outcome:
        outcome = self.target.run(case)
        if outcome.health != 200:
            try:
                self.restart()
            except AssertionError as exc:  # the case's failure stands; say how the shutdown went
                outcome.add(
                    "health",
                    f"and the server did not shut down cleanly: {exc!r} ({exc.__cause__!r})",
                )
        return outcome

    def restart(self) -> None:
        self.target.close()
        try:
            self.server.restart()
        finally:
            self.target = Target(self.server.base_url)  # the new server's store is empty

    def close(self) -> None:
        self.target.close()


def engine_threads() -> list[threading.Thread]:
    from mlx_nursery.engine import THREAD_NAME

    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.fixture(scope="module")
def fuzz(tiny_model: Path) -> Iterator[Fuzz]:
    before = len(engine_threads())
    server = ServerThread(tiny_model, **SERVER_SETTINGS)
    server.start()
    runner = Fuzz(server)
    try:
        yield runner
    finally:
        runner.close()
        server.stop()
    assert len(engine_threads()) == before, "an engine thread outlived the fuzz server"


def check(outcome: Outcome) -> None:
    """One assertion per kind of failure: Hypothesis reports each kind as a bug of its own."""
    report = outcome.report()
    assert not outcome.of("5xx"), report
    assert not outcome.of("in_stream_5xx"), report
    assert not outcome.of("envelope"), report
    assert not outcome.of("stream"), report
    assert not outcome.of("schema"), report
    assert not outcome.of("transport"), report
    assert not outcome.of("hang"), report
    assert not outcome.of("health"), report
    assert not outcome.of("rejected"), report
    assert len(outcome.problems) == 0, report


SHRINK = os.environ.get("MLX_NURSERY_FUZZ_SHRINK") == "1"
"""Shrinking a failure replays it against the server hundreds of times (minutes per failure),
so it is off unless asked for: a failure is reported as drawn, with a note on what was done."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate, *([Phase.shrink] if SHRINK else [])],
)


def _chat(**fields: Any) -> Case:
    return Case(
        "hostile",
        "chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            **fields,
        },
    )


def _response(**fields: Any) -> Case:
    return Case(
        "hostile", "responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4, **fields}
    )


def _completion(**fields: Any) -> Case:
    return Case(
        "hostile", "completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields}
    )


@pytest.mark.slow
@FUZZ
@given(case=valid_case())
@example(case=attrs.evolve(_chat(seed=-1), flavour="valid"))
@example(case=attrs.evolve(_completion(seed=2**63 - 1, stream=True), flavour="valid"))
@example(case=attrs.evolve(_chat(seed=-(2**63), temperature=1.0), flavour="valid"))
def test_valid_requests(fuzz: Fuzz, case: Case) -> None:
    check(fuzz.run(case))


@pytest.mark.slow
@FUZZ
@given(case=almost_valid_case())
@example(
    case=attrs.evolve(
        _response(text={"format": {"type": "json_schema", "schema": {"type": "object"}}}),
        flavour="almost",
    )
)
@example(
    case=attrs.evolve(
        _response(
            text={
                "format": {
                    "type": "json_schema",
                    "name": "o",
                    "description": None,
                    "schema": {"type": "object"},
                }
            }
        ),
        flavour="almost",
    )
)
def test_almost_valid_requests(fuzz: Fuzz, case: Case) -> None:
    check(fuzz.run(case))


# The findings of issue 15 and of the long fuzz, run first in every run; the rest is drawn.
@pytest.mark.slow
@FUZZ
@given(case=hostile_case())
@example(case=_chat(seed=2**64))
@example(case=_chat(top_k=VOCAB, temperature=1.0))
@example(case=_chat(top_k=2**63))
@example(case=_chat(logit_bias={"²": 1}))
@example(case=_chat(tool_choice={"type": "function", "function": "f"}))
@example(case=_response(tool_choice={"type": "function", "function": "f"}))
@example(case=_chat(messages=[{"role": "user", "content": deep(1000)}]))
@example(
    case=_chat(
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": deep(1000, "object")}}],
    )
)
@example(
    case=_chat(
        messages=[
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": "[" * 1000 + "]" * 1000},
                    }
                ],
            },
            {"role": "user", "content": "hi"},
        ]
    )
)
@example(case=_chat(max_tokens=Raw("9" * 5000)))
@example(case=_response(input=[{"type": "reasoning", "summary": "x"}]))
@example(case=_completion(prompt="\ud800"))
@example(case=_response(previous_response_id="\ud800"))
@example(case=_response(user="\ud800", stream=True))
@example(case=_response(metadata={"k": "\ud800"}, stream=True))
@example(
    case=_response(
        text={"format": {"type": "json_schema", "name": "x", "schema": deep(1000, "object")}}
    )
)
@example(case=Case("hostile", "chat", b"not json", content_type="text/plain"))
@example(case=Case("hostile", "other", None, method="GET", path="/v1/models/" + "a" * 20_000))
@example(case=Case("hostile", "chat", {"model": MODEL}, headers=(("x-pad", "p" * 20_000),)))
@example(case=Case("hostile", "other", {"model": MODEL}, path="/v1//chat/completions"))
@example(
    case=Case(
        "hostile", "other", {"model": MODEL, "pad": "a" * 1_000_000}, path="/v1/chat/completions/"
    )
)
@example(
    case=Case("hostile", "completions", {"model": MODEL, "pad": "a" * 1_000_000}, method="DELETE")
)
def test_hostile_requests(fuzz: Fuzz, case: Case) -> None:
    check(fuzz.run(case))


def test_the_fuzz_judge_catches_what_it_looks_for(fuzz: Fuzz) -> None:
    """The checks themselves can fail: a stream cut short, a bare 500, an unhealthy server."""
    target = Judge()
    cut = Outcome(_chat(stream=True))
    target._judge_chunk_stream(
        cut, [(None, {"choices": [{"index": 0, "delta": {"content": "x"}}]})]
    )
    assert cut.of("stream")
    bare = Outcome(_chat())
    target._judge_error(bare, b"Internal Server Error")
    assert bare.of("envelope")
    failed = Outcome(_response(stream=True))
    target._stream_error(failed, "internal_error", "error event")
    assert failed.of("in_stream_5xx")
    missing = Outcome(_response(stream=True))
    target._judge_response_stream(
        missing, [("response.created", {"type": "response.created", "sequence_number": 0})]
    )
    assert missing.of("stream")
    refused = fuzz.target.run(
        attrs.evolve(_chat(), flavour="valid", body={"model": "nope", "messages": []})
    )
    assert refused.status == 404 or refused.status == 400
    assert refused.of("rejected") and not refused.of("envelope")
    # What an engine death sets off: the server is replaced, its threads joined, the new one serves.
    threads, restarts = len(engine_threads()), fuzz.server.restarts
    fuzz.restart()
    assert fuzz.server.restarts == restarts + 1 and len(engine_threads()) == threads
    assert fuzz.target.health() == 200
