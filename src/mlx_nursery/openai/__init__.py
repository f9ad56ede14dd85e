"""The OpenAI API: wire schemas and rendering for chat, completions, Responses, embeddings,
audio and model cards (and vLLM's /tokenize, /detokenize, rerank and score), and the adapters
from its requests to `generation` plans.

Knows nothing of HTTP frameworks: routes hand it parsed JSON and get back JSON-ready objects,
or a `generation.OpenAIError` that carries its status and envelope.
"""

from . import _wire_hooks  # noqa: F401  (the converter's OpenAI rules, before any structuring)
from ._audio import RESPONSE_FORMATS, PreparedSpeech, prepare_speech, speech_model_name
from ._audio_output import delta_event, done_event, transcript_body
from ._chat_endpoint import prepare_chat
from ._completions_endpoint import prepare_completion
from ._embeddings_endpoint import (
    EmbeddingLimits,
    PreparedEmbeddings,
    ServedEmbedder,
    embeddings_body,
    prepare_embeddings,
    run_embeddings,
)
from ._responses import PreparedResponse, prepare_response
from ._responses import parse_request as parse_responses_request
from ._responses_events import failed_event
from ._responses_items import input_items_page
from ._responses_output import ResponseBuilder
from ._responses_schemas import ResponsesRequest
from ._scoring_endpoint import (
    PreparedRerank,
    PreparedScore,
    prepare_rerank,
    prepare_score,
    rerank_body,
    score_body,
)
from ._speech import PreparedSynthesis, audio_delta_event, audio_done_event, prepare_synthesis
from ._speech_encoding import EncodingFailed, SpeechEncoder, encodable, pcm16, wav_header
from ._tokenize import Tokenized, prepare_detokenize, prepare_tokenize

__all__ = [
    "RESPONSE_FORMATS",
    "EmbeddingLimits",
    "EncodingFailed",
    "PreparedEmbeddings",
    "PreparedRerank",
    "PreparedResponse",
    "PreparedScore",
    "PreparedSpeech",
    "PreparedSynthesis",
    "ResponseBuilder",
    "ResponsesRequest",
    "ServedEmbedder",
    "SpeechEncoder",
    "Tokenized",
    "audio_delta_event",
    "audio_done_event",
    "delta_event",
    "done_event",
    "embeddings_body",
    "encodable",
    "failed_event",
    "input_items_page",
    "parse_responses_request",
    "pcm16",
    "prepare_chat",
    "prepare_completion",
    "prepare_detokenize",
    "prepare_embeddings",
    "prepare_rerank",
    "prepare_response",
    "prepare_score",
    "prepare_speech",
    "prepare_synthesis",
    "prepare_tokenize",
    "rerank_body",
    "run_embeddings",
    "score_body",
    "speech_model_name",
    "transcript_body",
    "wav_header",
]
