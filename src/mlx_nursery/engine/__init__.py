"""The engine: one MLX thread, lanes on a CapacityLimiter, continuous batching, prefix cache.

Knows nothing of HTTP or OpenAI: token ids in, `TokenEvent`s out.
"""

from ._config import EngineConfig
from ._engine import THREAD_NAME, Engine, EngineStatistics, open_engine
from ._errors import EngineError, EngineOverloaded, EngineUnavailable, PromptTooLong
from ._grammar import GrammarProcessor
from ._memory import default_memory_budget, memory_in_use
from ._messages import ModelInfo, WorkerStats
from ._prefix_cache import PrefixCache, PrefixCacheStats
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
    "DEFAULT_TEMPERATURES",
    "SAMPLE_RATE",
    "SPEECH_THREAD_NAME",
    "THREAD_NAME",
    "CancelStatistics",
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
    "Segment",
    "SpeechConfig",
    "SpeechEngine",
    "SpeechEvent",
    "SpeechModelInfo",
    "SpeechStatistics",
    "SpeechTask",
    "TokenEvent",
    "TokenLogprob",
    "TokenStream",
    "Transcript",
    "TranscriptionRequest",
    "Usage",
    "VisionProcessor",
    "Window",
    "Word",
    "WorkerStats",
    "default_memory_budget",
    "memory_in_use",
    "open_engine",
]
