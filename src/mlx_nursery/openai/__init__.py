"""The OpenAI layer: wire schemas, prompts, stop strings; engine requests in, wire objects out.

Knows nothing of HTTP frameworks: routes hand it parsed JSON and get back
JSON-ready objects, or an `OpenAIError` that carries its status and envelope.
"""

from ._converter import to_json
from ._endpoints import Prepared, prepare_chat, prepare_completion, with_processors
from ._errors import (
    GenerationFailed,
    InvalidRequest,
    ModelNotFound,
    OpenAIError,
    Overloaded,
    RequestTimeout,
    ResourceNotFound,
    Unavailable,
)
from ._generation import Finished, Output, TextDelta, generate_text
from ._models import ModelList
from ._served import ServedModel
from ._tools import ToolCallOut

__all__ = [
    "Finished",
    "GenerationFailed",
    "InvalidRequest",
    "ModelList",
    "ModelNotFound",
    "OpenAIError",
    "Output",
    "Overloaded",
    "Prepared",
    "RequestTimeout",
    "ResourceNotFound",
    "ServedModel",
    "TextDelta",
    "ToolCallOut",
    "Unavailable",
    "generate_text",
    "prepare_chat",
    "prepare_completion",
    "to_json",
    "with_processors",
]
