"""What a factory-made model's preset holds (`_presets.py` names them)."""

from __future__ import annotations

from typing import Any, Literal

import attrs


@attrs.frozen
class Preset:
    name: str
    config: dict[str, Any]
    trained_vocab: int  # BPE merges learned from the corpus; the rest is filler up to vocab_size
    image_processor: dict[str, Any] | None = None
    """A vision-language preset's image-processor settings (None: a text model)."""
    thinking: Literal["model", "prompt"] | None = None
    """Its template thinks (`<think>` / `</think>` tokens, `enable_thinking`): "model", the
    model opens its thinking itself (Qwen3); "prompt", the template opens it in the prompt
    and the output begins mid-thought (Qwen3.5, DeepSeek-R1-0528); None: no thinking."""
    embedding: dict[str, Any] | None = None
    """An embedding preset's sentence-transformers settings: `pooling` ("cls", "mean",
    "last"), `normalize`, `max_seq_length` (None: a generation model)."""
    speech: bool = False
    """A Whisper (speech-to-text) preset: written by `_whisper_factory.py`."""
    synthesis: bool = False
    """A KittenTTS or Kokoro (text-to-speech) preset: written by `_tts_factory.py`."""
    reranker: bool = False
    """A cross-encoder (one-label sequence classifier) preset: `_reranker_factory.py`."""

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])
