"""Everything the engine takes from mlx-lm and mlx-audio, in one place.

Every engine module imports mlx-lm's and mlx-audio's parts from here, so that the engine's
whole dependency on them, and above all on their private parts, is read in this file.
`tests/engine/test_upstream_contract.py` asserts, against the pinned versions (pyproject.toml),
that each private part exists and behaves as the engine relies on: an upgrade that breaks
one fails there, by name, rather than somewhere in a batch step.

Private parts relied on, and where:
- `BaseCache` (mlx-lm's `_BaseCache`): the base of `_kv_quant.QuantizedBatchKVCache`,
  which overrides its methods and implements `BatchKVCache`'s, method for method, because
  `BatchGenerator` calls them on every batch cache.
- `BatchGenerator`'s internals: `_schedule.ServingBatchGenerator` replaces its `_next`
  and reads `_counters`, `_prompt_batch`, `_generation_batch`, `_unprocessed_sequences`,
  `_currently_processing` and `_make_batch`.
- `GenerationBatch`'s internals: `_first_tokens.FirstFromChunk` replaces its first `_step`
  with that method's lines after the forward, and sets the fields `_step` reads;
  `_batch_speculating.BatchSpeculation` runs a verify step in place of `next` (its `_step`
  and checks, for several tokens a row), reading and setting the same fields (`_next_tokens`,
  `_next_logprobs`, `_current_*`, `_num_tokens`, `_matchers`, `_token_context`, `tokens`).
- `sampler_rows`: which rows a batched sampler call is for, read from the calling frame
  (mlx-lm's `GenerationBatch._step`): `BatchGenerator` passes a sampler only the logprobs.
- `byte_decoder` (mlx-lm's `_byte_decoder`): the GPT-2 byte table, for token bytes
  (`_detokenizer.TokenTexts`).
- Whisper's decoding parts (mlx-audio): `_whisper.py` runs `DecodingTask` with its own
  `Inference` and `GreedyDecoder` subclasses swapped in, and calls the model's private
  language detection (`detect_language`). They are imported on first use (this module's
  `__getattr__`): importing mlx-audio's speech models takes a while, and only the speech
  thread needs them, not the server's start.
- `mlx_lm_attention` (mlx-lm's `models/base.py` `scaled_dot_product_attention`), which each
  model module imports by name: `_decode_attention.install` replaces that name in the
  module of a loaded model's layers with a router that takes a ragged batch's decode step.
mlx-lm's public parts are re-exported as they are.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mlx_lm.generate import (
    BatchGenerator,
    GenerationBatch,
    PromptProcessingBatch,
    StopSequences,
    generation_stream,
)
from mlx_lm.models.base import create_attention_mask, create_causal_mask
from mlx_lm.models.base import scaled_dot_product_attention as mlx_lm_attention
from mlx_lm.models.cache import (
    BatchKVCache,
    KVCache,
    QuantizedKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.models.cache import _BaseCache as BaseCache
from mlx_lm.models.rope_utils import Llama3RoPE
from mlx_lm.sample_utils import greedy_sampler, make_logits_processors, make_sampler
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, StreamingDetokenizer

if TYPE_CHECKING:
    from mlx_audio.stt.models.whisper.audio import (
        FRAMES_PER_SECOND,
        HOP_LENGTH,
        N_FRAMES,
        N_SAMPLES,
        SAMPLE_RATE,
        log_mel_spectrogram,
        pad_or_trim,
    )
    from mlx_audio.stt.models.whisper.decoding import (
        DecodingOptions,
        DecodingTask,
        GreedyDecoder,
        Inference,
    )
    from mlx_audio.stt.models.whisper.timing import add_word_timestamps
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

try:  # mlx-lm's GPT-2 byte table; private, so its absence means: use mlx-lm's detokenizer
    from mlx_lm.tokenizer_utils import _byte_decoder
except ImportError:  # pragma: no cover - depends on the installed mlx-lm
    _byte_decoder = None
byte_decoder: Callable[[], dict[str, int]] | None = _byte_decoder

__all__ = [
    "FRAMES_PER_SECOND",
    "HOP_LENGTH",
    "LANGUAGES",
    "N_FRAMES",
    "N_SAMPLES",
    "SAMPLE_RATE",
    "TO_LANGUAGE_CODE",
    "BPEStreamingDetokenizer",
    "BaseCache",
    "BatchGenerator",
    "BatchKVCache",
    "DecodingOptions",
    "DecodingTask",
    "GenerationBatch",
    "GreedyDecoder",
    "Inference",
    "KVCache",
    "Llama3RoPE",
    "PromptProcessingBatch",
    "QuantizedKVCache",
    "StopSequences",
    "StreamingDetokenizer",
    "add_word_timestamps",
    "byte_decoder",
    "can_trim_prompt_cache",
    "create_attention_mask",
    "create_causal_mask",
    "detect_language",
    "generation_stream",
    "greedy_sampler",
    "log_mel_spectrogram",
    "make_logits_processors",
    "make_prompt_cache",
    "make_sampler",
    "mlx_lm_attention",
    "pad_or_trim",
    "sampler_rows",
    "trim_prompt_cache",
]

_WHISPER = "mlx_audio.stt.models.whisper"
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "FRAMES_PER_SECOND",
            "HOP_LENGTH",
            "N_FRAMES",
            "N_SAMPLES",
            "SAMPLE_RATE",
            "log_mel_spectrogram",
            "pad_or_trim",
        ),
        f"{_WHISPER}.audio",
    ),
    **dict.fromkeys(
        ("DecodingOptions", "DecodingTask", "GreedyDecoder", "Inference"), f"{_WHISPER}.decoding"
    ),
    "add_word_timestamps": f"{_WHISPER}.timing",
    "LANGUAGES": f"{_WHISPER}.tokenizer",
    "TO_LANGUAGE_CODE": f"{_WHISPER}.tokenizer",
}
"""mlx-audio's names, by the module each is imported from on first use."""

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


def sampler_rows() -> list[int] | None:
    """The uids of the rows a batched sampler is drawing for: call it from the sampler's
    `__call__` itself (it reads the frame that called that).

    `BatchGenerator` calls a row's sampler with the step's logprobs alone; the caller is
    mlx-lm's `GenerationBatch._step` (0.32.2), whose `uids` name the rows in order (None:
    the caller is not such a batch)."""
    caller = sys._getframe(2).f_locals.get("self")
    uids: list[int] | None = getattr(caller, "uids", None)
    return uids


def detect_language(model: Any, mel: Any) -> str:
    """The language mlx-audio's multilingual Whisper `model` detects in `mel` (a log-mel
    spectrogram of the whole clip: it looks at the first window), as a Whisper code."""
    language: str = model._detect_language(mel, None)
    return language
