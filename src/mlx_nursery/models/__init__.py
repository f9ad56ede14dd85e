"""Model runtime: loading models from local paths or the local HF cache, and the model factory."""

from ._loading import LoadedModel, ModelNotFoundError, load_model, resolve_model_path
from .factory import PRESETS, make_model

__all__ = [
    "PRESETS",
    "LoadedModel",
    "ModelNotFoundError",
    "load_model",
    "make_model",
    "resolve_model_path",
]
