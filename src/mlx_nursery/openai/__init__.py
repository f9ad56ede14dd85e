"""The OpenAI layer: wire schemas, prompts, stop strings; engine requests in, wire objects out.

Knows nothing of HTTP frameworks: routes hand it parsed JSON and get back
JSON-ready objects, or an `OpenAIError` that carries its status and envelope.
"""

from ._audio import (
    RESPONSE_FORMATS,
    AudioLimits,
    AudioUpload,
    PreparedSpeech,
    prepare_speech,
    speech_model_name,
)
from ._audio_output import delta_event, done_event, transcript_body
from ._chat_endpoint import CHAT as CHAT_WIRE
from ._chat_endpoint import prepare_chat
from ._completions_endpoint import prepare_completion
from ._converter import Tagged, register_tagged_union, structure, to_json
from ._embeddings_endpoint import (
    EmbeddingLimits,
    PreparedEmbeddings,
    ServedEmbedder,
    embeddings_body,
    prepare_embeddings,
    run_embeddings,
)
from ._endpoints import (
    Prepared,
    answer_only,
    common,
    prepared_for,
    with_processors,
    with_reasoning,
    with_response_format,
    with_script,
    with_tools,
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
from ._generation import Admitted, Finished, Output, ReasoningDelta, TextDelta, generate_text
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
    check_count,
    ignored_hints,
    ignored_values,
    reject_unimplemented,
)
from ._prompts import (
    ImageTaker,
    check_prompt_size,
    image_taker,
    longest_token_bytes,
    render_served_template,
)
from ._reasoning import thinking_format, thinking_on
from ._responses import PreparedResponse, prepare_response
from ._responses import parse_request as parse_responses_request
from ._responses_output import ResponseBuilder, input_items_page
from ._responses_schemas import ResponsesRequest, TextJsonSchemaFormat
from ._script_schema import ScriptSpec
from ._scripts import parse_script
from ._served import ServedModel, requested_model, unknown_model
from ._shared import FunctionTool, NamedToolChoice, SamplingFields
from ._structured import Grammars
from ._tokenizing import SegmentEncoder
from ._tool_choice import offered_tools
from ._tools import ToolCallOut, tool_format

__all__ = [
    "CHAT_WIRE",
    "RESPONSE_FORMATS",
    "Admitted",
    "AudioLimits",
    "AudioUpload",
    "Conflict",
    "ConnectionDropped",
    "EmbeddingLimits",
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
    "PreparedEmbeddings",
    "PreparedResponse",
    "PreparedSpeech",
    "ReasoningDelta",
    "RequestCaps",
    "RequestTimeout",
    "RequestTooLarge",
    "ResourceNotFound",
    "ResponseBuilder",
    "ResponsesRequest",
    "SamplingFields",
    "ScriptSpec",
    "SegmentEncoder",
    "ServedEmbedder",
    "ServedModel",
    "Tagged",
    "TextDelta",
    "TextJsonSchemaFormat",
    "ToolCallOut",
    "URITooLong",
    "Unavailable",
    "UnsupportedMediaType",
    "answer_only",
    "card_kind",
    "chat_images",
    "check_before_fetching",
    "check_count",
    "check_prompt_size",
    "common",
    "delta_event",
    "done_event",
    "embeddings_body",
    "fetch_images",
    "generate_text",
    "ignored_hints",
    "ignored_values",
    "image_taker",
    "input_items_page",
    "input_modalities",
    "longest_token_bytes",
    "offered_tools",
    "parse_json",
    "parse_media_hosts",
    "parse_responses_request",
    "parse_script",
    "prepare_chat",
    "prepare_completion",
    "prepare_embeddings",
    "prepare_response",
    "prepare_speech",
    "prepared_for",
    "quoted",
    "register_tagged_union",
    "reject_unimplemented",
    "render_served_template",
    "requested_model",
    "responses_images",
    "run_embeddings",
    "speech_model_name",
    "structure",
    "thinking_format",
    "thinking_on",
    "to_json",
    "tool_format",
    "transcript_body",
    "unknown_model",
    "with_processors",
    "with_reasoning",
    "with_response_format",
    "with_script",
    "with_tools",
]
