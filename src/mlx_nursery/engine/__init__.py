"""The engine: one MLX thread, fair lanes, continuous batching, prefix cache.

Knows nothing of HTTP or OpenAI: token ids in, `TokenEvent`s out.
"""

from ._adapters import AdapterBusy, AdapterError, AdaptersDisabled, UnknownAdapter
from ._config import EngineConfig
from ._disk_entries import DiskCacheStats
from ._drafting import SPECULATION_METHODS, Speculation
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
from ._memory import default_memory_budget, kv_budget, memory_in_cache, memory_in_use
from ._messages import ModelInfo, WorkerStats
from ._prefix_cache import PrefixCache, PrefixCacheStats
from ._priority import WAIT_BUCKETS, WaitStatistics
from ._speech import SPEECH_THREAD_NAME, SpeechConfig, SpeechEngine, SpeechEvent
from ._speech_types import (
    DEFAULT_TEMPERATURES,
    SAMPLE_RATE,
    Segment,
    SpeechModelInfo,
    SpeechStatistics,
    SpeechTask,
    Transcript,
    TranscriptionRequest,
    Window,
    Word,
)
from ._statistics import CancelStatistics
from ._stream import CONSUMER_STALLED, TokenStream
from ._synthesis import SYNTHESIS_THREAD_NAME, SynthesisConfig, SynthesisEngine, SynthesisEvent
from ._synthesis_types import (
    AudioChunk,
    SynthesisModelInfo,
    SynthesisRequest,
    SynthesisStatistics,
    Synthesized,
)
from ._types import (
    PRIORITY_LIMIT,
    FinishReason,
    GenerationRequest,
    ImageInputs,
    LogitsProcessor,
    SamplingParams,
    Script,
    TokenEvent,
    Tokenizer,
    TokenLogprob,
    Usage,
)
from ._vision import VisionProcessor

__all__ = [
    "CONSUMER_STALLED",
    "DEFAULT_TEMPERATURES",
    "EMBEDDING_THREAD_NAME",
    "KV_BITS",
    "KV_GROUP_SIZES",
    "PRIORITY_LIMIT",
    "SAMPLE_RATE",
    "SPECULATION_METHODS",
    "SPEECH_THREAD_NAME",
    "SYNTHESIS_THREAD_NAME",
    "THREAD_NAME",
    "WAIT_BUCKETS",
    "AdapterBusy",
    "AdapterError",
    "AdaptersDisabled",
    "AudioChunk",
    "CancelStatistics",
    "DiskCacheStats",
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
    "LogitsProcessor",
    "ModelInfo",
    "PrefixCache",
    "PrefixCacheStats",
    "PromptTooLong",
    "SamplingParams",
    "Script",
    "Segment",
    "Speculation",
    "SpeechConfig",
    "SpeechEngine",
    "SpeechEvent",
    "SpeechModelInfo",
    "SpeechStatistics",
    "SpeechTask",
    "SynthesisConfig",
    "SynthesisEngine",
    "SynthesisEvent",
    "SynthesisModelInfo",
    "SynthesisRequest",
    "SynthesisStatistics",
    "Synthesized",
    "ThinkingGate",
    "TokenEvent",
    "TokenLogprob",
    "TokenStream",
    "Tokenizer",
    "Transcript",
    "TranscriptionRequest",
    "UnknownAdapter",
    "Usage",
    "VisionProcessor",
    "WaitStatistics",
    "Window",
    "Word",
    "WorkerStats",
    "default_memory_budget",
    "kv_budget",
    "memory_in_cache",
    "memory_in_use",
    "open_engine",
]
