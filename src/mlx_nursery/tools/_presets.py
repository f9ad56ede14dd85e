"""Architecture presets for factory-made models.

`tiny`, `tiny-thinking`, `small`, `tiny-qwen2`, `tiny-vlm`, `tiny-embedding`,
`tiny-reranker`, `tiny-reranker-xlmr`, `tiny-whisper`, `tiny-tts` (a KittenTTS:
text-to-speech) and `tiny-kokoro` (a Kokoro) are for tests; `qwen3-0.6b`, `llama-3.1-8b`,
`llama-3.1-70b` (quantized, for serving across devices), `llama-3.2-1b` (the 8B's draft
model), `qwen2.5-vl-3b`, `bert-base` (an embedding model) and `bge-reranker-base` (a
cross-encoder) carry the real architecture configs (random weights) so benchmarks run at
real shapes.
`tiny-thinking` and `tiny-thinking-open` are `tiny` with a tokenizer whose `<think>` /
`</think>` are added tokens and a Qwen3-style template that honours `enable_thinking`.
`tiny-qwen2` is an architecture mlx-lm splits by layers (pipeline parallel; `tiny`'s qwen3
splits by tensor only), with two layers for each of two ranks.
"""

from __future__ import annotations

from typing import Any

from ._preset import Preset as Preset
from ._speech_presets import SPEECH_PRESETS


def _qwen3(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
    }
    config.update(overrides)
    return config


def _llama3(*, rope_factor: float = 8.0, **overrides: Any) -> dict[str, Any]:
    """A Llama 3.x config: its tokenizer's vocabulary, grouped KV of 8 heads, llama3 RoPE
    scaling (by `rope_factor`) to a context of 131,072."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "vocab_size": 128_256,
        "rope_theta": 500_000.0,
        "max_position_embeddings": 131_072,
        "rope_scaling": {
            "factor": rope_factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    }
    config.update(overrides)
    return config


_TINY = _qwen3(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=2048,
    max_position_embeddings=4096,
)

PRESETS: dict[str, Preset] = {
    "tiny": Preset("tiny", _TINY, trained_vocab=2048),
    "tiny-thinking": Preset("tiny-thinking", _TINY, trained_vocab=2040, thinking="model"),
    "tiny-thinking-open": Preset(
        "tiny-thinking-open", _TINY, trained_vocab=2040, thinking="prompt"
    ),
    "small": Preset(
        "small",
        _qwen3(
            hidden_size=256,
            num_hidden_layers=4,
            intermediate_size=768,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=32,
            vocab_size=8192,
            max_position_embeddings=16384,
        ),
        trained_vocab=4096,
    ),
    "tiny-qwen2": Preset(
        "tiny-qwen2",
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
            "hidden_size": 128,  # heads of 32: its KV quantizes (`tiny`'s 16 do not)
            "num_hidden_layers": 4,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "vocab_size": 2048,
            "rope_theta": 1_000_000.0,
            "max_position_embeddings": 4096,
            # Its own output head: a random model whose head is its embedding mostly repeats
            # its input's last token, and greedy tokens would hardly depend on the layers.
            "tie_word_embeddings": False,
        },
        trained_vocab=2048,
    ),
    "qwen3-0.6b": Preset(
        "qwen3-0.6b",
        _qwen3(
            hidden_size=1024,
            num_hidden_layers=28,
            intermediate_size=3072,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151_936,
            max_position_embeddings=40_960,
        ),
        trained_vocab=4096,
    ),
    "llama-3.1-8b": Preset(
        "llama-3.1-8b",
        _llama3(
            hidden_size=4096,
            num_hidden_layers=32,
            intermediate_size=14336,
            num_attention_heads=32,
        ),
        trained_vocab=4096,
    ),
    # A model too large for one 80 GB GPU even at 8 bits: served across devices (issue 33).
    "llama-3.1-70b": Preset(
        "llama-3.1-70b",
        _llama3(
            hidden_size=8192,
            num_hidden_layers=80,
            intermediate_size=28672,
            num_attention_heads=64,
        ),
        trained_vocab=4096,
    ),
    # Llama-3.1-8B's usual draft model: the same tokenizer (this preset's is built alike).
    "llama-3.2-1b": Preset(
        "llama-3.2-1b",
        _llama3(
            rope_factor=32.0,
            hidden_size=2048,
            num_hidden_layers=16,
            intermediate_size=8192,
            num_attention_heads=32,
            head_dim=64,
            tie_word_embeddings=True,
        ),
        trained_vocab=4096,
    ),
    "tiny-vlm": Preset(
        "tiny-vlm",
        {
            "architectures": ["Qwen2VLForConditionalGeneration"],
            "model_type": "qwen2_vl",
            "hidden_act": "silu",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "vocab_size": 2048,
            "rope_theta": 1_000_000.0,
            "max_position_embeddings": 4096,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
            "tie_word_embeddings": True,
            "vision_config": {
                "model_type": "qwen2_vl",
                "depth": 2,
                "embed_dim": 32,
                "hidden_size": 64,
                "num_heads": 2,
                "mlp_ratio": 2,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "in_channels": 3,
            },
        },
        trained_vocab=2048,
        # Any image becomes 1 to 16 image tokens (28x28-pixel blocks, at most 112x112).
        image_processor={"min_pixels": 784, "max_pixels": 12544},
    ),
    "qwen2.5-vl-3b": Preset(
        "qwen2.5-vl-3b",
        {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "model_type": "qwen2_5_vl",
            "hidden_act": "silu",
            "hidden_size": 2048,
            "num_hidden_layers": 36,
            "intermediate_size": 11008,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "vocab_size": 151_936,
            "rope_theta": 1_000_000.0,
            "max_position_embeddings": 128_000,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "tie_word_embeddings": True,
            "vision_config": {
                "model_type": "qwen2_5_vl",
                "depth": 32,
                "hidden_size": 1280,
                "intermediate_size": 3420,
                "out_hidden_size": 2048,
                "num_heads": 16,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "window_size": 112,
                "fullatt_block_indexes": [7, 15, 23, 31],
                "in_channels": 3,
                "tokens_per_second": 2,
            },
        },
        trained_vocab=4096,
        # Qwen2.5-VL's own processor limits: a 448x448 image is 256 image tokens.
        image_processor={"min_pixels": 3136, "max_pixels": 12_845_056},
    ),
    "tiny-embedding": Preset(
        "tiny-embedding",
        {
            "architectures": ["BertModel"],
            "model_type": "bert",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
            "vocab_size": 1024,
            # Trained so that a prefix of the vector is an embedding too (`dimensions`):
            # these sizes, as sentence-transformers' Matryoshka models declare them.
            "matryoshka_dimensions": [16, 32, 64],
        },
        trained_vocab=1024,
        embedding={"pooling": "mean", "normalize": True, "max_seq_length": 128},
    ),
    "bert-base": Preset(
        "bert-base",
        {
            "architectures": ["BertModel"],
            "model_type": "bert",
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
            "vocab_size": 30522,
        },
        trained_vocab=4096,
        # bge-base / all-mpnet-like: CLS pooling, normalized, 512 tokens per input.
        embedding={"pooling": "cls", "normalize": True, "max_seq_length": 512},
    ),
    # Cross-encoders: a pair's relevance is the one logit of a sequence classifier.
    "tiny-reranker": Preset(
        "tiny-reranker",
        {
            "architectures": ["BertForSequenceClassification"],
            "model_type": "bert",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            # Short, as the embedding preset's inputs are: a full-length pair stays cheap.
            "max_position_embeddings": 128,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
            "vocab_size": 1024,
        },
        trained_vocab=1024,
        reranker=True,
    ),
    "tiny-reranker-xlmr": Preset(
        "tiny-reranker-xlmr",
        {
            "architectures": ["XLMRobertaForSequenceClassification"],
            "model_type": "xlm-roberta",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "max_position_embeddings": 130,
            "type_vocab_size": 1,
            "layer_norm_eps": 1e-5,
            "vocab_size": 1024,
        },
        trained_vocab=1024,
        reranker=True,
    ),
    "bge-reranker-base": Preset(
        "bge-reranker-base",
        {
            # BAAI/bge-reranker-base's config: XLM-RoBERTa base with a one-label head.
            "architectures": ["XLMRobertaForSequenceClassification"],
            "model_type": "xlm-roberta",
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "max_position_embeddings": 514,
            "type_vocab_size": 1,
            "layer_norm_eps": 1e-5,
            "vocab_size": 250_002,
        },
        trained_vocab=4096,
        reranker=True,
    ),
    "tiny-whisper": Preset(
        "tiny-whisper",
        {
            # Hugging Face's Whisper config keys, which mlx-audio maps to its own.
            "architectures": ["WhisperForConditionalGeneration"],
            "model_type": "whisper",
            "d_model": 64,
            "encoder_layers": 1,  # an encoder layer costs over a second a window on a CPU
            "decoder_layers": 2,
            "encoder_attention_heads": 1,
            "decoder_attention_heads": 1,
            "num_mel_bins": 80,
            "max_source_positions": 1500,
            # Whisper's is 448; 64 keeps a random model's windows short in tests (32 tokens).
            "max_target_positions": 64,
            # Under 51865 ids: an English-only Whisper (no language or task tokens in its
            # prompt). The top 1501 ids are the timestamps <|0.00|>..<|30.00|>.
            "vocab_size": 1944,
        },
        trained_vocab=1944 - 1501 - 9,
        speech=True,
    ),
    **SPEECH_PRESETS,
}
