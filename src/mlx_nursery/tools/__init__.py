"""Build-time tools, not the serving runtime: the tiny-model factory (random-weight models
of real architectures, written offline for tests and benchmarks), random LoRA adapters for
them, and the converters from other formats (GGUF, CTranslate2 Whisper). The runtime may
call a converter (the default model is a converted GGUF); nothing here imports the rest of
the package."""

from ._adapter_factory import make_adapter
from ._presets import Preset
from ._tokenizer_factory import EOS_TOKEN, PAD_TOKEN, write_tokenizer
from .factory import PRESETS, make_model
from .gguf import GGUFConversionError, convert_gguf
from .whisper_ct2 import CT2FormatError, convert_ct2_whisper

__all__ = [
    "EOS_TOKEN",
    "PAD_TOKEN",
    "PRESETS",
    "CT2FormatError",
    "GGUFConversionError",
    "Preset",
    "convert_ct2_whisper",
    "convert_gguf",
    "make_adapter",
    "make_model",
    "write_tokenizer",
]
