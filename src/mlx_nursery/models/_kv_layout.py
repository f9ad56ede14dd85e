"""What a token's keys and values cost in a model, read from its files before it loads.

The engine measures the cost on the loaded model (engine/_memory.py, `kv_bytes_per_token`)
and caps the context it serves by its KV budget. The model list must say that context
before the model loads, so the registry computes it from this layout: the same arithmetic
as mlx-lm's caches (per layer, keys and values of `kv_heads x head_dim` in the activations'
dtype; a quantized cache packs them to `bits` with a scale and a bias per group). A config
whose attention is not of that kind (latent attention, recurrent or linear layers) has no
layout here: the list then shows the model's own context until the model has loaded.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import attrs

_FLOAT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_TOWERS = ("vision", "visual", "audio", "multi_modal_projector", "mm_projector")
"""Weight name parts of the towers beside the language model: their dtype is not its."""
_OTHER_ATTENTION = (
    "kv_lora_rank",  # latent attention (DeepSeek V2/V3): keys are not kv_heads x head_dim
    "ssm_state_size",  # Mamba layers
    "mamba_d_state",
    "linear_num_value_heads",  # linear attention (Qwen3-Next)
    "attn_layer_indices",  # hybrids that name their attention layers
    "layers_block_type",
    "hybrid_override_pattern",
)
_ATTENTION_LAYERS = ("full_attention", "sliding_attention", "attention")


@attrs.frozen
class KVLayout:
    """A token's keys and values in a model: `layers` of `kv_heads x head_dim` values each
    for keys and for values, `dtype_bytes` wide."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    def bytes_per_token(self, bits: int | None = None, group_size: int = 64) -> int:
        """What a token's KV costs in the engine's caches: as they are, or quantized to
        `bits` (packed values, and a scale and a bias per `group_size` values)."""
        vectors = self.layers * 2 * self.kv_heads
        if bits is None:
            return vectors * self.head_dim * self.dtype_bytes
        packed = self.head_dim * bits // 8
        scales_and_biases = 2 * (self.head_dim // group_size) * self.dtype_bytes
        return vectors * (packed + scales_and_biases)


def kv_layout(path: Path, config: dict[str, Any]) -> KVLayout | None:
    """`path`'s KV layout, from its config and its weight files' headers (the widest float
    dtype of the language model's weights: the activations, and so the KV, promote to it).
    None where the config describes another kind of attention, or says too little. Reads
    only the files' headers: a worker thread."""
    text = config.get("text_config")
    sections = [text, config] if isinstance(text, dict) else [config]
    if any(key in section for section in sections for key in _OTHER_ATTENTION):
        return None
    layer_types = _first(sections, "layer_types")
    if isinstance(layer_types, list) and not set(layer_types) <= set(_ATTENTION_LAYERS):
        return None
    layers, heads = _first(sections, "num_hidden_layers"), _first(sections, "num_attention_heads")
    if not (isinstance(layers, int) and isinstance(heads, int) and heads > 0):
        return None
    kv_heads = _first(sections, "num_key_value_heads") or heads
    head_dim = _first(sections, "head_dim") or _hidden(sections) // heads
    dtype_bytes = _widest_float(path)
    if not (isinstance(kv_heads, int) and isinstance(head_dim, int) and head_dim and dtype_bytes):
        return None
    return KVLayout(layers, kv_heads, head_dim, dtype_bytes)


def _first(sections: list[Any], key: str) -> Any:
    """`key`'s value in the first section that has it (a VLM's text_config first)."""
    return next((section[key] for section in sections if section.get(key) is not None), None)


def _hidden(sections: list[Any]) -> int:
    hidden = _first(sections, "hidden_size")
    return hidden if isinstance(hidden, int) else 0


def _widest_float(path: Path) -> int:
    """The widest float dtype, in bytes, among the language model's weights (0: none)."""
    widest = 0
    for file in path.glob("*.safetensors"):
        try:
            header = _header(file)
        except (OSError, ValueError, struct.error):
            return 0  # unreadable: its load will say why
        for name, entry in header.items():
            if name == "__metadata__" or any(tower in name for tower in _TOWERS):
                continue
            if isinstance(entry, dict):
                widest = max(widest, _FLOAT_BYTES.get(str(entry.get("dtype")), 0))
    return widest


def _header(file: Path) -> dict[str, Any]:
    """A safetensors file's header: a little-endian u64 length, then that much JSON."""
    with file.open("rb") as stream:
        (length,) = struct.unpack("<Q", stream.read(8))
        header = json.loads(stream.read(length))
    return header if isinstance(header, dict) else {}
