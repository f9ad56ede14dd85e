"""Model runtime: loading models and tokenizers from local paths or the local HF cache,
and the built-in models (the default, the scripted) written once into the user cache."""

from ._embedding_loading import Activation, Classifier, EmbeddingSpec, PoolingMode
from ._fusing import FusedPart, fused_sizes
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
from ._lora import AdapterBank, AdapterError
from ._speech import SpeechModel, load_speech_model
from ._streams import release_mlx_streams
from ._synthesis import SynthesisModel, SynthesizedPiece, load_synthesis_model

__all__ = [
    "Activation",
    "AdapterBank",
    "AdapterError",
    "Classifier",
    "EmbeddingSpec",
    "FusedPart",
    "LoadedModel",
    "ModelFacts",
    "ModelLoadError",
    "ModelNotFoundError",
    "PoolingMode",
    "SpeechModel",
    "SynthesisModel",
    "SynthesizedPiece",
    "fused_sizes",
    "load_model",
    "load_speech_model",
    "load_synthesis_model",
    "model_facts",
    "model_kind",
    "release_mlx_streams",
    "resolve_model_path",
]
