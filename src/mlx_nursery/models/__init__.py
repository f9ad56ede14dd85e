"""Model runtime: loading models and tokenizers from local paths or the local HF cache,
and the built-in models (the default, the scripted) written once into the user cache."""

from ._embedding_loading import Activation, Classifier, EmbeddingSpec, PoolingMode
from ._loading import (
    LoadedModel,
    ModelFacts,
    ModelLoadError,
    ModelNotFoundError,
    load_model,
    model_facts,
    model_kind,
    resolve_model_path,
)
from ._speech import SpeechModel, load_speech_model
from ._streams import release_mlx_streams

__all__ = [
    "Activation",
    "Classifier",
    "EmbeddingSpec",
    "LoadedModel",
    "ModelFacts",
    "ModelLoadError",
    "ModelNotFoundError",
    "PoolingMode",
    "SpeechModel",
    "load_model",
    "load_speech_model",
    "model_facts",
    "model_kind",
    "release_mlx_streams",
    "resolve_model_path",
]
