"""/tokenize and /detokenize, in vLLM's shapes (vllm/entrypoints/openai/protocol.py): a
prompt counted exactly as the model will see it, and token ids back to text.

/tokenize takes a completion-style body (`prompt`) or a chat-style one (`messages`). The
chat form renders through chat completions' own rendering (`chat_prompt`: the template, the
tools as shown under its `tool_choice`, `chat_template_kwargs`, images), so its `count` is
the `prompt_tokens` of the same chat request. Nothing reaches the engine: tokenizing runs
on a preparation thread.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..generation import (
    ChatMessage,
    FunctionTool,
    InvalidRequest,
    NamedToolChoice,
    ServedModel,
    ToolChoiceMode,
    check_count,
    check_token_ids,
    prompted_tools,
    reject_unimplemented,
    require,
    structure,
    template_variables,
    text_tokens,
    to_json,
)
from ._chat_endpoint import chat_prompt

_UNIMPLEMENTED: dict[str, object] = {
    # A template sent by the client is code the server would run; the multimodal
    # processor's options are not the server's to change per request.
    "chat_template": (),
    "mm_processor_kwargs": ({},),
    "media_io_kwargs": ({},),
}


@attrs.define(kw_only=True)
class TokenizeCompletionRequest:
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


@attrs.define(kw_only=True)
class TokenizeChatRequest:
    messages: list[ChatMessage]
    model: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoiceMode | NamedToolChoice | None = None
    """As a chat request's: "none" shows the template no tools, so the count is the same
    request's; a forced choice is checked as chat checks it."""
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None


@attrs.define(kw_only=True)
class DetokenizeRequest:
    tokens: list[int]
    model: str | None = None


@attrs.frozen
class TokenizeResponse:
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


@attrs.frozen
class Tokenized:
    """A /tokenize answer, and the hints it accepted without acting on them (the chat form's
    `chat_template_kwargs` that its template does not read: `x-ignored-params`)."""

    body: dict[str, Any]
    ignored: tuple[str, ...] = ()


def prepare_tokenize(body: Any, served: ServedModel) -> Tokenized:
    """`body`'s prompt as `served` tokenizes it. Raises InvalidRequest (400).
    Blocking: a worker thread."""
    if isinstance(body, dict) and "messages" in body:
        return _tokenize_chat(structure(body, TokenizeChatRequest), served)
    request = structure(body, TokenizeCompletionRequest)
    _check_model(request.model, served)
    tokens = text_tokens(
        served, request.prompt, "prompt", special_tokens=request.add_special_tokens
    )
    return Tokenized(_response(served, tokens, request.return_token_strs))


def prepare_detokenize(body: Any, served: ServedModel) -> dict[str, Any]:
    """`body`'s token ids as text, special tokens included. Raises InvalidRequest (400)
    for an id that is not one of the model's. Blocking: a worker thread."""
    request = structure(body, DetokenizeRequest)
    _check_model(request.model, served)
    check_token_ids(served, request.tokens, "tokens", indexed=True)
    return {"prompt": served.tokenizer.decode(request.tokens)}


def _tokenize_chat(request: TokenizeChatRequest, served: ServedModel) -> Tokenized:
    _check_model(request.model, served)
    reject_unimplemented(request, _UNIMPLEMENTED)
    require(
        not (request.continue_final_message and request.add_generation_prompt),
        "continue_final_message",
        "continue_final_message and add_generation_prompt cannot both be true: set "
        "add_generation_prompt to false to continue the last message",
    )
    check_count(len(request.messages), served.caps.max_messages, "messages")
    tools = prompted_tools(request.tools, request.tool_choice, served)
    variables = template_variables(
        request.chat_template_kwargs, served.tokenizer, None, strict=served.strict_params
    )
    tokens, images = chat_prompt(
        served,
        request.messages,
        tools,
        variables,
        continue_final=request.continue_final_message,
        generation_prompt=request.add_generation_prompt,
        special_tokens=request.add_special_tokens,
    )
    if images is not None and request.add_special_tokens:
        raise InvalidRequest(
            "add_special_tokens cannot be applied to a prompt with images (the model's "
            "processor tokenizes it)",
            param="add_special_tokens",
            code="unsupported_parameter",
        )
    return Tokenized(_response(served, tokens, request.return_token_strs), variables.ignored)


def _check_model(model: str | None, served: ServedModel) -> None:
    if model is not None:  # vLLM's model is optional: the one served
        served.check(model)


def _response(served: ServedModel, tokens: list[int], token_strs: bool | None) -> dict[str, Any]:
    strs = None
    if token_strs:
        found = served.tokenizer.convert_ids_to_tokens(tokens)
        strs = [text if isinstance(text, str) else "" for text in found]
    body: dict[str, Any] = to_json(
        TokenizeResponse(len(tokens), served.context_length, tokens, strs)
    )
    return body
