"""The OpenAI layer: wire schemas, prompts, stop strings; engine requests in, wire objects out.

Knows nothing of HTTP frameworks: routes hand it parsed JSON and get back
JSON-ready objects, or an `OpenAIError` that carries its status and envelope.
"""

from ._chat_endpoint import prepare_chat
from ._completions_endpoint import prepare_completion
from ._converter import to_json
from ._embeddings_endpoint import (
    EmbeddingLimits,
    PreparedEmbeddings,
    ServedEmbedder,
    embeddings_body,
    prepare_embeddings,
    run_embeddings,
)
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
from ._models import ModelCard, ModelList, input_modalities
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
    "Conflict",
    "ConnectionDropped",
    "EmbeddingLimits",
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
    "PreparedEmbeddings",
    "PreparedResponse",
    "RequestCaps",
    "RequestTimeout",
    "RequestTooLarge",
    "ResourceNotFound",
    "ResponseBuilder",
    "ResponsesRequest",
    "ScriptSpec",
    "SegmentEncoder",
    "ServedEmbedder",
    "ServedModel",
    "TextDelta",
    "ToolCallOut",
    "URITooLong",
    "Unavailable",
    "UnsupportedMediaType",
    "chat_image_urls",
    "embeddings_body",
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
    "prepare_embeddings",
    "prepare_response",
    "quoted",
    "requested_model",
    "responses_image_urls",
    "run_embeddings",
    "to_json",
    "tool_format",
    "unknown_model",
    "with_processors",
]
