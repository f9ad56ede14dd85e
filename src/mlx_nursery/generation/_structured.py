"""Structured outputs by constrained decoding with llguidance.

Why llguidance: it compiles JSON Schema lazily (no per-schema precompute over the whole
vocabulary, so a new schema costs nothing up front), computes a token mask in tens of
microseconds, reports the schema features it cannot enforce by name, and is what mlx-vlm
already ships. xgrammar needs a per-vocabulary compile step and ties its fast path to torch.

Each request gets its own matcher, wrapped as a logits processor, so constraints apply per
sequence inside the batched engine: the processor advances the matcher with the token the
engine sampled last, then masks every token the grammar does not allow (once the JSON is
complete, only EOS remains).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from ..engine import GrammarProcessor
from ._errors import InvalidRequest
from ._request_parts import (
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    ResponseFormat,
    TextFormat,
    TextFormatParam,
    TextJsonSchemaFormat,
)


class Grammars:
    """Per model: llguidance's view of the tokenizer, built once, on first use."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._hf = getattr(tokenizer, "_tokenizer", tokenizer)
        self._vocab_size = vocab_size
        self._lock = threading.Lock()
        self._llt: Any = None

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._llt is None:
                import llguidance.hf

                self._llt = llguidance.hf.from_tokenizer(self._hf, n_vocab=self._vocab_size)
            return self._llt

    def json_processor(self, schema: dict[str, Any] | None, param: str) -> GrammarProcessor:
        """A processor for JSON matching `schema` (None: any JSON object). 400 if unenforceable."""
        import llguidance

        text = json.dumps(schema if schema is not None else {"type": "object"})
        return self._processor(
            lambda: llguidance.LLMatcher.grammar_from_json_schema(
                text,
                defaults=_COMPACT,  # type: ignore[arg-type]  # a TypedDict of these keys
            ),
            param,
            "unsupported JSON schema",
        )

    def tool_call_processor(
        self,
        tools: list[dict[str, Any]],
        markup: tuple[str, str],
        param: str,
        *,
        name: str | None = None,
    ) -> GrammarProcessor:
        """Force exactly one call, in the model's `<start>JSON<end>` format, of `name` (or of any
        of `tools`), with arguments valid against that tool's parameters schema."""
        import llguidance

        chosen = [t for t in tools if name is None or t["function"]["name"] == name]
        call = {"anyOf": [_call_schema(t["function"]) for t in chosen], "x-guidance": _COMPACT}
        start, end = markup
        lark = (
            f'start: {json.dumps(start)} "\\n" call "\\n" {json.dumps(end)}\n'
            f"call: %json {json.dumps(call)}"
        )
        return self._processor(
            lambda: llguidance.LLMatcher.grammar_from_lark(lark),
            param,
            "cannot constrain to these tools",
        )

    def strict_tools_processor(
        self,
        tools: list[dict[str, Any]],
        strict: frozenset[str],
        markup: tuple[str, str],
        param: str,
    ) -> GrammarProcessor:
        """Tool choice "auto" with strict tools: free text until the model opens a call (a lazy
        trigger on the start markup, as llama.cpp's lazy grammars), then one call of a known
        tool whose arguments match its schema if it is strict (any object if not), then free
        text again; any number of calls. llguidance's StructTag writes the grammar."""
        import llguidance
        from llguidance._struct_tag import StructTag

        schemas = [
            _call_schema(
                t["function"]
                if t["function"]["name"] in strict
                else {**t["function"], "parameters": {"type": "object"}}
            )
            for t in tools
        ]
        start, end = markup
        tag = StructTag(
            trigger=start,
            begin=start + "\n",
            end="\n" + end,
            grammar={"anyOf": schemas, "x-guidance": _COMPACT},
        )
        lark = StructTag.to_grammar([tag], assume_special=False)
        return self._processor(
            lambda: llguidance.LLMatcher.grammar_from_lark(lark),
            param,
            "cannot constrain to these tools",
        )

    def _processor(self, compile_grammar: Any, param: str, problem: str) -> GrammarProcessor:
        """Compile and validate against this tokenizer; a grammar llguidance refuses is a 400
        whose message names what it could not enforce."""
        import llguidance

        try:
            grammar = compile_grammar()
        except ValueError as exc:  # llguidance's only compile error; it names the feature
            raise InvalidRequest(
                f"{problem}: {exc}", param=param, code="unsupported_schema"
            ) from None
        tokenizer = self._tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise InvalidRequest(f"{problem}: {error}", param=param, code="unsupported_schema")
        return GrammarProcessor(
            llguidance.LLMatcher(tokenizer, grammar), tokenizer.vocab_size, param
        )


_COMPACT = {"whitespace_flexible": False}


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": function["name"]},
            "arguments": function.get("parameters") or {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


_SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def response_format_processor(
    grammars: Grammars, response_format: ResponseFormat | TextFormatParam | None, param: str
) -> GrammarProcessor | None:
    """Chat's `response_format` ({"type": "text" | "json_object" | "json_schema"}) and the
    Responses `text.format` (the same, json_schema flattened) to a processor, or None."""
    if response_format is None or isinstance(response_format, TextFormat):
        return None
    if isinstance(response_format, JsonObjectFormat):
        return grammars.json_processor(None, param)
    if isinstance(response_format, JsonSchemaFormat):  # chat nests it; Responses does not
        spec: JsonSchemaSpec | TextJsonSchemaFormat = response_format.json_schema
        where = f"{param}.json_schema"
    else:
        spec, where = response_format, param
    if not _SCHEMA_NAME.fullmatch(spec.name):
        # As OpenAI: a name is required, a-z, A-Z, 0-9, underscores and dashes, at most 64.
        raise InvalidRequest(
            "json_schema needs a 'name' of at most 64 letters, digits, '_' or '-'",
            param=f"{where}.name",
            code="invalid_value",
        )
    if spec.schema is None:
        raise InvalidRequest(
            "json_schema needs a 'schema'", param=where, code="missing_required_parameter"
        )
    return grammars.json_processor(spec.schema, f"{where}.schema")
