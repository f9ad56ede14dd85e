"""The engine: one MLX thread, lanes on a CapacityLimiter, continuous batching, prefix cache.

Knows nothing of HTTP or OpenAI: token ids in, `TokenEvent`s out.
"""

from ._config import EngineConfig
from ._embedder import EMBEDDING_THREAD_NAME, Embedder, EmbedderConfig, EmbeddingRequest
from ._embedding_worker import EmbeddingModelInfo
from ._engine import THREAD_NAME, Engine, EngineStatistics, open_engine
from ._errors import (
    EmbeddingFailed,
    EngineError,
    EngineOverloaded,
    EngineUnavailable,
    PromptTooLong,
)
from ._grammar import GrammarProcessor, ThinkingGate
from ._kv_quant import KV_BITS, KV_GROUP_SIZES
from ._memory import default_memory_budget, memory_in_cache, memory_in_use
from ._messages import ModelInfo, WorkerStats
from ._prefix_cache import PrefixCache, PrefixCacheStats
from ._statistics import CancelStatistics
from ._stream import TokenStream
from ._types import (
    FinishReason,
    GenerationRequest,
    ImageInputs,
    SamplingParams,
    Script,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from ._vision import VisionProcessor

__all__ = [
    "EMBEDDING_THREAD_NAME",
    "KV_BITS",
    "KV_GROUP_SIZES",
    "THREAD_NAME",
    "CancelStatistics",
    "Embedder",
    "EmbedderConfig",
    "EmbeddingFailed",
    "EmbeddingModelInfo",
    "EmbeddingRequest",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineOverloaded",
    "EngineStatistics",
    "EngineUnavailable",
    "FinishReason",
    "GenerationRequest",
    "GrammarProcessor",
    "ImageInputs",
    "ModelInfo",
    "PrefixCache",
    "PrefixCacheStats",
    "PromptTooLong",
    "SamplingParams",
    "Script",
    "ThinkingGate",
    "TokenEvent",
    "TokenLogprob",
    "TokenStream",
    "Usage",
    "VisionProcessor",
    "WorkerStats",
    "default_memory_budget",
    "memory_in_cache",
    "memory_in_use",
    "open_engine",
]
