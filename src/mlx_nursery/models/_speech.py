"""Speech-to-text models: Whisper directories, loaded with mlx-audio.

A directory is a Whisper when its config says `"model_type": "whisper"` (Hugging Face's or
mlx-audio's layout: config.json, *.safetensors, the tokenizer and preprocessor_config.json
that transformers' WhisperProcessor reads).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from mlx_audio.stt.models.whisper.whisper import Model as Whisper


@attrs.frozen
class SpeechModel:
    """A loaded Whisper; to be used only from the thread that loaded it."""

    path: Path
    model: Whisper
    """mlx-audio's Whisper (mlx-audio has no type hints: unchecked)."""
    word_timestamps: bool
    """Whether it has alignment heads (generation_config.json), which word timestamps need."""

    @property
    def multilingual(self) -> bool:
        return bool(self.model.is_multilingual)


def load_speech_model(path: Path) -> SpeechModel:
    """Load the Whisper at `path`. Strict: a missing weight is an error, never left random.
    On the CPU its weights are cast to float32 (mlx-audio's loader makes float16, which the
    CPU backend computes far slower). Makes MLX calls: call it on the thread that will use
    the model."""
    import mlx.core as mx
    from mlx_audio.stt import load

    from ._loading import ModelLoadError

    try:
        model = load(str(path), strict=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelLoadError(f"{path}: not a Whisper mlx-audio can load ({exc})") from exc
    if getattr(model, "_processor", None) is None:
        raise ModelLoadError(f"{path}: its tokenizer or preprocessor_config.json is missing")
    if mx.default_device() == mx.cpu:
        model.set_dtype(mx.float32)
        model.dtype = mx.float32
    return SpeechModel(path, model, _has_alignment_heads(path))


def _has_alignment_heads(path: Path) -> bool:
    try:
        config = json.loads((path / "generation_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("alignment_heads"))
