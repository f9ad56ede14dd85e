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
from ._chat_endpoint import prepare_chat
from ._completions_endpoint import prepare_completion
from ._converter import to_json
from ._endpoints import Prepared, with_processors
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
from ._generation import Finished, Output, TextDelta, generate_text
from ._images import ImageLimits
from ._json import parse_json
from ._logprobs import LogprobEntry
from ._media_fetch import chat_image_urls, fetch_images, responses_image_urls
from ._models import ModelCard, ModelList, card_kind, input_modalities
from ._params import RequestCaps
from ._prompts import longest_token_bytes
from ._responses import PreparedResponse, prepare_response
from ._responses import parse_request as parse_responses_request
from ._responses_output import ResponseBuilder, input_items_page
from ._responses_schemas import ResponsesRequest
from ._script_schema import ScriptSpec
from ._scripts import parse_script
from ._served import ServedModel, requested_model, unknown_model
from ._structured import Grammars
from ._tokenizing import SegmentEncoder
from ._tools import ToolCallOut, tool_format

__all__ = [
    "RESPONSE_FORMATS",
    "AudioLimits",
    "AudioUpload",
    "Conflict",
    "ConnectionDropped",
    "FaultStatus",
    "Finished",
    "Forbidden",
    "GenerationFailed",
    "Grammars",
    "HeadersTooLarge",
    "ImageLimits",
    "InvalidRequest",
    "LogprobEntry",
    "ModelCard",
    "ModelList",
    "ModelNotFound",
    "OpenAIError",
    "Output",
    "Overloaded",
    "Prepared",
    "PreparedResponse",
    "PreparedSpeech",
    "RequestCaps",
    "RequestTimeout",
    "RequestTooLarge",
    "ResourceNotFound",
    "ResponseBuilder",
    "ResponsesRequest",
    "ScriptSpec",
    "SegmentEncoder",
    "ServedModel",
    "TextDelta",
    "ToolCallOut",
    "URITooLong",
    "Unavailable",
    "UnsupportedMediaType",
    "card_kind",
    "chat_image_urls",
    "delta_event",
    "done_event",
    "fetch_images",
    "generate_text",
    "input_items_page",
    "input_modalities",
    "longest_token_bytes",
    "parse_json",
    "parse_responses_request",
    "parse_script",
    "prepare_chat",
    "prepare_completion",
    "prepare_response",
    "prepare_speech",
    "quoted",
    "requested_model",
    "responses_image_urls",
    "speech_model_name",
    "to_json",
    "tool_format",
    "transcript_body",
    "unknown_model",
    "with_processors",
]
