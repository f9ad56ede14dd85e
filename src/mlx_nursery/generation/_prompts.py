"""Prompts to token ids: chat messages through the model's chat template, raw completion prompts.

Tokenizing is the costly part of preparing a request (seconds for megabytes of text), so a
prompt whose text alone is far beyond what the context could hold is refused before it is
tokenized: no token of the vocabulary covers more than `max_token_bytes` bytes of text, so
text longer than `context_length * max_token_bytes` bytes cannot fit in the context.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2

from .. import fault_points
from ..engine import ImageInputs, VisionProcessor
from ._errors import InvalidRequest, quoted, shortened
from ._image_taker import ImageTaker
from ._images import ImageLimits
from ._request_parts import ChatMessage, ContentPart
from ._served import ServedModel
from ._tools import call_arguments_for_template, fallback_messages


def longest_token_bytes(vocabulary: Iterable[str | bytes]) -> int:
    """The most bytes of text one token stands for, bounded from above: a token's UTF-8 length
    is at least the bytes it decodes to (byte-level BPE: the same or more; SentencePiece's
    "▁" and "<0x0A>" tokens: more)."""
    return max(
        (
            len(t) if isinstance(t, bytes) else len(t.encode("utf-8", "surrogatepass"))
            for t in vocabulary
        ),
        default=0,
    )


def check_prompt_size(served: ServedModel, texts: Iterable[str], param: str) -> None:
    """Refuse at once (400, context_length_exceeded) text that could not fit in the context."""
    if not served.max_token_bytes:
        return
    limit = served.context_length * served.max_token_bytes
    texts = list(texts)
    chars = sum(len(t) for t in texts)
    if chars * 4 <= limit:  # UTF-8: at most 4 bytes per character
        return
    size = chars if chars > limit else sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if size > limit:
        raise InvalidRequest(
            f"This model's maximum context length is {served.context_length} tokens; the "
            f"prompt's text ({size} bytes) is far longer than that many tokens can hold.",
            param=param,
            code="context_length_exceeded",
        )


def prompt_texts(messages: Iterable[ChatMessage], tools: list[dict[str, Any]]) -> Iterator[str]:
    """The text a chat template certainly renders: message content (strings and text parts),
    tool calls' arguments, and the tools shown (as JSON, which templates render them as)."""
    for message in messages:
        if isinstance(message.content, str):
            yield message.content
        elif message.content:
            yield from (part.text for part in message.content if isinstance(part.text, str))
        for call in message.tool_calls or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                yield function["arguments"]
    if tools:
        yield json.dumps(tools, ensure_ascii=False)


def render_chat(
    tokenizer: Any,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    *,
    native_tools: bool = True,
) -> list[int]:
    """Token ids of `messages` through the model's chat template. With `native_tools` false,
    tools, calls and results are written in the fallback convention (`_tools.ToolFormat`)."""
    tokens, _ = render_chat_prompt(tokenizer, messages, tools, native_tools=native_tools)
    return tokens


def render_chat_prompt(
    tokenizer: Any,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    *,
    native_tools: bool = True,
    vision: VisionProcessor | None = None,
    limits: ImageLimits | None = None,
    where: Callable[[int], str] = lambda index: f"messages[{index}]",
    url_param: str = "image_url.url",
    encode: Callable[[str], list[int]] | None = None,
    thinking: bool | None = None,
    variables: Mapping[str, Any] | None = None,
    continue_final: bool = False,
    generation_prompt: bool | None = None,
) -> tuple[list[int], ImageInputs | None]:
    """`render_chat`, images included: with a vision model's processor (`vision`), image
    parts are decoded under `limits` and the processor turns the rendered text and the
    images into token ids (a placeholder per image token) and the images' inputs. Without
    one, an image part is refused. Errors name message i as `where(i)`. `encode`, if given,
    tokenizes the rendered text instead of the template (a `SegmentEncoder`'s, which gives
    the same ids). `thinking` is the template's `enable_thinking` (None: its default);
    `variables`, `continue_final` and `generation_prompt` as `render_template` takes them.
    Blocking (decoding, processing): a worker thread."""
    if not messages:
        raise InvalidRequest(
            "'messages' must contain at least one message", param="messages", code="invalid_value"
        )
    takes = ImageTaker(vision, limits or ImageLimits(), url_param)
    rendered = [_message(where(i), m, takes) for i, m in enumerate(messages)]
    return render_template(
        tokenizer,
        rendered,
        tools,
        native_tools=native_tools,
        images=takes,
        encode=encode,
        thinking=thinking,
        variables=variables,
        continue_final=continue_final,
        generation_prompt=generation_prompt,
    )


def render_template(
    tokenizer: Any,
    rendered: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    native_tools: bool = True,
    images: ImageTaker | None = None,
    encode: Callable[[str], list[int]] | None = None,
    continue_final: bool = False,
    thinking: bool | None = None,
    variables: Mapping[str, Any] | None = None,
    generation_prompt: bool | None = None,
) -> tuple[list[int], ImageInputs | None]:
    """Messages in the chat template's own shape to token ids (and the images' inputs): the
    core every API renders its conversation through (chat and Responses by
    `render_chat_prompt`, the Messages API by its own conversion, /tokenize by chat's).

    The shape: `role`; `content` a string, or parts (`{"type": "text", "text"}` and the
    `{"type": "image"}` placeholders `images` took, in order); an assistant's `tool_calls`
    (`{"id", "type": "function", "function": {"name", "arguments": a mapping}}`); a tool
    result's `tool_call_id`. `continue_final`: the last message is an assistant's reply to
    continue (a prefill) rather than a turn to answer. `thinking`: the template's
    `enable_thinking` (None: its default). `variables`: more of the template's variables
    (a request's `chat_template_kwargs`, checked: `_template_kwargs.py`).
    `generation_prompt`: whether the assistant's turn is opened after the messages (None:
    unless `continue_final`). Blocking: a worker thread."""
    fault_points.reach("template")
    if not native_tools:
        rendered, tools = fallback_messages(rendered, tools or []), None
    extra: dict[str, Any] = dict(variables or {})
    if tools:
        extra["tools"] = tools
    if thinking is not None:
        extra["enable_thinking"] = thinking
    if continue_final:
        extra["continue_final_message"] = True
    opened = not continue_final if generation_prompt is None else generation_prompt
    taken = images is not None and bool(images.images)
    try:
        if taken or encode is not None:
            text = tokenizer.apply_chat_template(
                rendered, add_generation_prompt=opened, tokenize=False, **extra
            )
            if taken:
                assert images is not None
                return images.prepare(text)
            assert encode is not None
            fault_points.reach("tokenize")
            return encode(text), None
        fault_points.reach("tokenize")
        tokens = tokenizer.apply_chat_template(
            rendered, add_generation_prompt=opened, tokenize=True, **extra
        )
    except (jinja2.TemplateError, TypeError, ValueError) as exc:
        # The template's own checks (`raise_exception`: role order, ...) and what its Python
        # operations raise on the values given (a filter on the wrong type), and transformers'
        # checks of the conversation: the client's messages, not a server error.
        reason = shortened(str(exc), 200)
        raise InvalidRequest(
            f"the model's chat template rejected the messages: {reason}",
            param="messages",
            code="invalid_value",
        ) from None
    # transformers 5 returns a BatchEncoding-like mapping for tokenize=True
    if isinstance(tokens, dict) or hasattr(tokens, "input_ids"):
        tokens = tokens["input_ids"]
    return list(tokens), None


def render_served(
    served: ServedModel,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    *,
    special_tokens: bool = False,
    **where: Any,
) -> tuple[list[int], ImageInputs | None]:
    """`render_chat_prompt` with what the served model says: its tokenizer, tool format,
    vision processor and image limits (`where` and `url_param` name errors; `thinking`
    turns a thinking template's thinking on or off; `variables`, `continue_final` and
    `generation_prompt` as `render_template` takes them). `special_tokens`: the rendered
    text is tokenized with the tokenizer's special tokens (/tokenize's `add_special_tokens`;
    never for a generation, whose template writes what the model expects). Images are
    tokenized by the vision processor, which decides that itself."""
    encode = served.encoder.encode if served.encoder is not None else None
    if special_tokens:
        encode = functools.partial(_with_special_tokens, served.tokenizer)
    return render_chat_prompt(
        served.tokenizer,
        messages,
        tools,
        native_tools=served.tool_format.native,
        vision=served.vision,
        limits=served.image_limits,
        encode=encode,
        **where,
    )


def _with_special_tokens(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=True))


def render_served_template(
    served: ServedModel,
    rendered: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    images: ImageTaker,
    *,
    continue_final: bool = False,
    thinking: bool | None = None,
) -> tuple[list[int], ImageInputs | None]:
    """`render_template` with what the served model says (its tokenizer, tool format and
    encoder); `images` is the request's `ImageTaker` (`image_taker(served)`); `thinking` the
    template's `enable_thinking` (None: its default)."""
    return render_template(
        served.tokenizer,
        rendered,
        tools,
        native_tools=served.tool_format.native,
        images=images,
        encode=served.encoder.encode if served.encoder is not None else None,
        continue_final=continue_final,
        thinking=thinking,
    )


def _message(where: str, message: ChatMessage, images: ImageTaker) -> dict[str, Any]:
    for name in ("function_call", "audio"):
        if getattr(message, name):
            raise InvalidRequest(
                f"'{where}.{name}' is not supported",
                param=f"{where}.{name}",
                code="unsupported_parameter",
            )
    role = "system" if message.role == "developer" else message.role
    rendered: dict[str, Any] = {"role": role, "content": _content(where, message, images)}
    if message.name:
        rendered["name"] = message.name
    reasoning = _reasoning(where, message)
    if reasoning is not None:
        rendered["reasoning_content"] = reasoning  # the name Qwen3-style templates read
    if message.tool_calls:
        if message.role != "assistant":
            raise InvalidRequest(
                "only assistant messages carry tool_calls",
                param=f"{where}.tool_calls",
                code="invalid_value",
            )
        rendered["tool_calls"] = [
            _tool_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(message.tool_calls)
        ]
    if message.role == "tool":
        if not message.tool_call_id:
            raise InvalidRequest(
                "tool messages need the 'tool_call_id' they answer",
                param=f"{where}.tool_call_id",
                code="missing_required_parameter",
            )
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _reasoning(where: str, message: ChatMessage) -> str | None:
    """An assistant message's earlier reasoning, as clients send it back: `reasoning_content`
    (DeepSeek's, vLLM's and llama.cpp's name) or `reasoning` (vLLM's and OpenRouter's)."""
    given = [
        (name, value)
        for name, value in (
            ("reasoning_content", message.reasoning_content),
            ("reasoning", message.reasoning),
        )
        if value is not None
    ]
    if not given:
        return None
    name, value = given[0]
    if message.role != "assistant":
        raise InvalidRequest(
            f"only assistant messages carry {name}",
            param=f"{where}.{name}",
            code="invalid_value",
        )
    return value


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequest(
            "a tool call needs a function with a name", param=where, code="invalid_value"
        )
    arguments = function.get("arguments", "{}")
    param = f"{where}.function.arguments"
    if not isinstance(arguments, str):
        raise InvalidRequest(
            "tool call arguments must be a JSON string", param=param, code="invalid_value"
        )
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {
            "name": function["name"],
            "arguments": call_arguments_for_template(arguments, param),
        },
    }


def _content(where: str, message: ChatMessage, images: ImageTaker) -> str | list[Any]:
    """A message's content for the template: its text, or, when it holds images, its parts
    in order (text parts and image placeholders)."""
    content = message.content
    if isinstance(content, str) or not content or all(_said(message, p) for p in content):
        return _text(where, message)
    parts: list[Any] = []
    for j, part in enumerate(content):
        if part.type == "image_url":
            parts.append(images.take(part, f"{where}.content[{j}]"))
        elif part.type == "text" and part.text is not None:
            parts.append({"type": "text", "text": part.text})
        else:
            raise _unsaid_part(where, j, message, part)
    return parts


def _text(where: str, message: ChatMessage) -> str:
    content = message.content
    if content is None:
        if message.role != "assistant":
            raise InvalidRequest(
                f"'{where}.content' is required for role {message.role!r}",
                param=f"{where}.content",
                code="invalid_value",
            )
        return message.refusal or ""  # an assistant's refusal is what it said
    if isinstance(content, str):
        return content
    pieces = []
    for j, part in enumerate(content):
        if not _said(message, part):
            raise _unsaid_part(where, j, message, part)
        pieces.append(part.text if part.type == "text" else part.refusal)
    return "".join(p for p in pieces if p is not None)


def _said(message: ChatMessage, part: ContentPart) -> bool:
    """A part that is text: a text part, or an assistant's refusal part (OpenAI's
    `ChatCompletionRequestAssistantMessageContentPart`, which a replayed reply may hold)."""
    if part.type == "text":
        return part.text is not None
    return part.type == "refusal" and message.role == "assistant" and part.refusal is not None


def _unsaid_part(where: str, index: int, message: ChatMessage, part: ContentPart) -> InvalidRequest:
    """Why a part says nothing: a text (or an assistant's refusal) part without its field,
    or a kind of part this route does not take."""
    at = f"{where}.content[{index}]"
    if part.type == "text" or (part.type == "refusal" and message.role == "assistant"):
        field = f"{at}.{part.type}"
        message_ = f"Missing required parameter: '{field}'"
        return InvalidRequest(message_, param=field, code="missing_required_parameter")
    kind = quoted(part.type)
    return InvalidRequest(
        f"content parts of type {kind} are not supported (text only)",
        param=f"{at}.type",
        code="unsupported_content",
    )
