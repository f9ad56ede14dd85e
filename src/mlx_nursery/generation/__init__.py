"""The protocol-neutral generation front: the typed request plan (`Prepared`) that every API
(OpenAI chat, completions, Responses; Anthropic Messages) builds, the one error tree and its
map from engine errors, prompts and tokenizing, reasoning, stop strings, tool calls,
structured outputs, logprobs, images and media, audio decoding, and the generation loop.

Knows no wire format beyond the request parts the APIs share and no HTTP framework: the wire
packages (`openai`, `anthropic`) turn their requests into plans and render the events.
"""

from ._audio_input import AudioLimits, AudioUpload, decode_audio, sniff_format
from ._checkpoint import checkpoint
from ._converter import (
    Tagged,
    register_lenient,
    register_tagged_union,
    register_unstructure_hook,
    structure,
    to_json,
    unstructure_fields,
)
from ._engine_errors import (
    api_error,
    context_length_error,
    engine_errors_as_api_errors,
    request_timed_out,
)
from ._errors import (
    Conflict,
    ConnectionDropped,
    FaultStatus,
    Forbidden,
    GenerationFailed,
    HeadersTooLarge,
    InvalidRequest,
    ModelNotFound,
    OpenAIError,
    Overloaded,
    RequestTimeout,
    RequestTooLarge,
    ResourceNotFound,
    Unavailable,
    UnsupportedMediaType,
    URITooLong,
    quoted,
)
from ._generate import Admitted, Finished, Output, ReasoningDelta, TextDelta, generate_text
from ._image_taker import ImageTaker, image_taker
from ._images import ImageLimits
from ._json import parse_json
from ._logprobs import LogprobEntry
from ._media_fetch import (
    ImageRef,
    MediaFetches,
    chat_images,
    check_before_fetching,
    fetch_images,
    responses_images,
)
from ._media_hosts import parse_media_hosts
from ._models import ModelCard, ModelList, card_kind, input_modalities
from ._params import (
    RequestCaps,
    check_between,
    check_count,
    ignored_hints,
    ignored_values,
    reject_unimplemented,
    require,
)
from ._plan import (
    Prepared,
    answer_only,
    common,
    prepared_for,
    with_logprobs,
    with_processors,
    with_reasoning,
    with_response_format,
    with_script,
    with_tools,
)
from ._prompts import (
    check_prompt_size,
    completion_tokens,
    longest_token_bytes,
    prompt_texts,
    render_served,
    render_served_template,
)
from ._reasoning import switchable, thinking_format, thinking_on, thinking_switch
from ._request_parts import (
    ChatMessage,
    FunctionTool,
    NamedToolChoice,
    ResponseFormat,
    SamplingFields,
    TextFormat,
    TextFormatParam,
    TextJsonSchemaFormat,
    ToolChoiceMode,
    ToolChoiceType,
    new_id,
    now,
)
from ._script_schema import ScriptSpec
from ._scripts import last_user_text, parse_script
from ._served import ServedModel, requested_model, unknown_model
from ._structured import Grammars
from ._tokenizing import SegmentEncoder
from ._tool_choice import offered_tools
from ._tools import ToolCallOut, strict_tool_names, tool_format

__all__ = [
    "Admitted",
    "AudioLimits",
    "AudioUpload",
    "ChatMessage",
    "Conflict",
    "ConnectionDropped",
    "FaultStatus",
    "Finished",
    "Forbidden",
    "FunctionTool",
    "GenerationFailed",
    "Grammars",
    "HeadersTooLarge",
    "ImageLimits",
    "ImageRef",
    "ImageTaker",
    "InvalidRequest",
    "LogprobEntry",
    "MediaFetches",
    "ModelCard",
    "ModelList",
    "ModelNotFound",
    "NamedToolChoice",
    "OpenAIError",
    "Output",
    "Overloaded",
    "Prepared",
    "ReasoningDelta",
    "RequestCaps",
    "RequestTimeout",
    "RequestTooLarge",
    "ResourceNotFound",
    "ResponseFormat",
    "SamplingFields",
    "ScriptSpec",
    "SegmentEncoder",
    "ServedModel",
    "Tagged",
    "TextDelta",
    "TextFormat",
    "TextFormatParam",
    "TextJsonSchemaFormat",
    "ToolCallOut",
    "ToolChoiceMode",
    "ToolChoiceType",
    "URITooLong",
    "Unavailable",
    "UnsupportedMediaType",
    "answer_only",
    "api_error",
    "card_kind",
    "chat_images",
    "check_before_fetching",
    "check_between",
    "check_count",
    "check_prompt_size",
    "checkpoint",
    "common",
    "completion_tokens",
    "context_length_error",
    "decode_audio",
    "engine_errors_as_api_errors",
    "fetch_images",
    "generate_text",
    "ignored_hints",
    "ignored_values",
    "image_taker",
    "input_modalities",
    "last_user_text",
    "longest_token_bytes",
    "new_id",
    "now",
    "offered_tools",
    "parse_json",
    "parse_media_hosts",
    "parse_script",
    "prepared_for",
    "prompt_texts",
    "quoted",
    "register_lenient",
    "register_tagged_union",
    "register_unstructure_hook",
    "reject_unimplemented",
    "render_served",
    "render_served_template",
    "request_timed_out",
    "requested_model",
    "require",
    "responses_images",
    "sniff_format",
    "strict_tool_names",
    "structure",
    "switchable",
    "thinking_format",
    "thinking_on",
    "thinking_switch",
    "to_json",
    "tool_format",
    "unknown_model",
    "unstructure_fields",
    "with_logprobs",
    "with_processors",
    "with_reasoning",
    "with_response_format",
    "with_script",
    "with_tools",
]
