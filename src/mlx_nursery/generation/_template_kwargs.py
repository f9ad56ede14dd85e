"""A chat request's `chat_template_kwargs` (vLLM's field): extra variables for the model's
chat template, checked before they reach it.

- A key the server sets itself, or a parameter of transformers' `apply_chat_template`, is a
  400 naming it: a request cannot replace its messages, its tools, the template or how the
  prompt is tokenized (a template is code the server runs).
- `enable_thinking` is the switch `reasoning_effort` also sets: a boolean, and the two must
  agree when both are given.
- A key the template never reads changes nothing: it is accepted and named in
  `x-ignored-params` (a 400 with --strict-params), as the other hints are. Which variables a
  template reads is found by parsing it; a template that does not parse as plain Jinja (an
  extension's tags) is taken to read every key.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs
import jinja2
import jinja2.meta

from ._errors import InvalidRequest, quoted
from ._params import ignored_values

PARAM = "chat_template_kwargs"
RESERVED = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""What the server gives the template itself, and `apply_chat_template`'s own parameters."""


@attrs.frozen
class TemplateVariables:
    """What a request's `chat_template_kwargs` come to."""

    values: Mapping[str, Any] = attrs.field(factory=dict)
    """Variables for the template, `enable_thinking` apart."""
    thinking: bool | None = None
    """The template's `enable_thinking` (None: its default)."""
    ignored: tuple[str, ...] = ()
    """Keys the template does not read, as `x-ignored-params` names them."""


def template_variables(
    given: Mapping[str, Any] | None,
    tokenizer: Any,
    thinking: bool | None,
    *,
    strict: bool,
    param: str = PARAM,
) -> TemplateVariables:
    """`given` checked for `tokenizer`'s chat template; `thinking` is the switch the request
    set otherwise (its `reasoning_effort`; None: not set). Raises InvalidRequest (400)."""
    if not given:
        return TemplateVariables(thinking=thinking)
    for key in given:
        if key in RESERVED:
            raise InvalidRequest(
                f"'{param}.{key}' is set by the server: a request cannot set it",
                param=f"{param}.{key}",
                code="invalid_value",
            )
    values = dict(given)
    read = _variables(getattr(tokenizer, "chat_template", None))
    if "enable_thinking" in values and (read is None or "enable_thinking" in read):
        switch = values.pop("enable_thinking")
        if not isinstance(switch, bool):
            raise InvalidRequest(
                f"'{param}.enable_thinking' must be a boolean, got {quoted(switch)}",
                param=f"{param}.enable_thinking",
                code="invalid_type",
            )
        if thinking is not None and thinking != switch:
            raise InvalidRequest(
                f"reasoning_effort and {param}.enable_thinking disagree; set only one",
                param=f"{param}.enable_thinking",
                code="invalid_value",
            )
        thinking = switch
    unread = {f"{param}.{k}": v for k, v in values.items() if read is not None and k not in read}
    ignored = ignored_values(unread, strict=strict)
    kept = {k: v for k, v in values.items() if f"{param}.{k}" not in unread}
    return TemplateVariables(kept, thinking, ignored)


def _variables(template: Any) -> frozenset[str] | None:
    """The variables a chat template (or each of a tokenizer's named ones) reads; None where
    one does not parse as plain Jinja (then no key can be said to be unread)."""
    texts = template.values() if isinstance(template, dict) else [template]
    read: set[str] = set()
    for text in texts:
        if not isinstance(text, str):
            continue
        found = _read_by(text)
        if found is None:
            return None
        read |= found
    return frozenset(read)


@functools.lru_cache(maxsize=16)
def _read_by(text: str) -> frozenset[str] | None:
    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(text)))
    except jinja2.TemplateSyntaxError:
        return None
