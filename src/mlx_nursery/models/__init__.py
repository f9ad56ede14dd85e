"""Model runtime: loading models from local paths or the local HF cache, and the model factory."""

from ._embedding_loading import EmbeddingSpec, PoolingMode
from ._loading import (
    LoadedModel,
    ModelFacts,
    ModelLoadError,
    ModelNotFoundError,
    load_model,
    model_facts,
    resolve_model_path,
)
from ._speech import SpeechModel, load_speech_model
from .factory import PRESETS, make_model

__all__ = [
    "PRESETS",
    "EmbeddingSpec",
    "LoadedModel",
    "ModelFacts",
    "ModelLoadError",
    "ModelNotFoundError",
    "PoolingMode",
    "SpeechModel",
    "load_model",
    "load_speech_model",
    "make_model",
    "model_facts",
    "resolve_model_path",
]
