"""Write a random LoRA adapter for a model, in mlx-lm's adapter layout, offline.

Tests and benchmarks of per-request adapters need adapters without training one: this
writes `adapter_config.json` as mlx-lm's `tuner/utils.py` reads it (fine_tune_type "lora",
num_layers, lora_parameters {rank, scale, dropout, keys}) and `adapters.safetensors` with
mlx-lm's parameter names (`model.layers.N.self_attn.q_proj.lora_a`, (in, rank); `lora_b`,
(rank, out)), for the last `layers` blocks. `lora_a` is drawn as mlx-lm initializes it;
`lora_b`, zeros in a fresh mlx-lm adapter, is random here, so that the adapter changes the
model's output. The same base, seed and options give the same bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.quantized import QuantizedLinear

DEFAULT_KEYS = ("q_proj", "v_proj")
"""The projections adapted unless told: mlx-lm's LoRA default for attention."""


def make_adapter(
    out: str | Path,
    base: str | Path,
    *,
    seed: int = 0,
    rank: int = 8,
    layers: int = 2,
    keys: Sequence[str] = DEFAULT_KEYS,
    scale: float = 20.0,
) -> Path:
    """Write a random adapter for the model directory `base` into `out`; return `out`.
    `keys` name projections by their last parts (`q_proj`) or their path in a block
    (`self_attn.q_proj`). Raises ValueError when they match nothing in the last `layers`
    blocks. Makes MLX calls on the calling thread."""
    from mlx_lm.utils import load_model

    if rank < 1 or layers < 1:
        raise ValueError("rank and layers must be at least 1")
    model, _ = load_model(Path(base), lazy=True)
    weights, matched = _random_matrices(model, rank, layers, keys, seed)
    if not weights:
        raise ValueError(f"no projection named {', '.join(keys)} in the last {layers} blocks")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "fine_tune_type": "lora",
        "num_layers": layers,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0, "keys": matched},
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    mx.eval(list(weights.values()))
    mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    return folder


def _random_matrices(
    model: Any, rank: int, layers: int, keys: Sequence[str], seed: int
) -> tuple[dict[str, mx.array], list[str]]:
    """The adapter's arrays by mlx-lm's names, and the keys (paths in a block) they adapt."""
    key = mx.random.key(seed)
    blocks = model.layers[-layers:]
    offset = len(model.layers) - len(blocks)
    weights: dict[str, mx.array] = {}
    matched: set[str] = set()
    for index, block in enumerate(blocks, start=offset):
        for name, module in sorted(block.named_modules(), key=lambda item: str(item[0])):
            if not isinstance(module, (Linear, QuantizedLinear)):
                continue
            if not any(name == k or name.endswith(f".{k}") for k in keys):
                continue
            out_dims, in_dims = _dims(module)
            key, key_a, key_b = mx.random.split(key, 3)
            bound = 1 / math.sqrt(in_dims)
            prefix = f"model.layers.{index}.{name}"
            weights[f"{prefix}.lora_a"] = mx.random.uniform(
                -bound, bound, (in_dims, rank), key=key_a
            )
            weights[f"{prefix}.lora_b"] = mx.random.normal((rank, out_dims), key=key_b) * 0.05
            matched.add(str(name))
    return weights, sorted(matched)


def _dims(linear: Module) -> tuple[int, int]:
    """(out, in) of a `Linear` or `QuantizedLinear`."""
    weight = linear.weight
    if isinstance(linear, QuantizedLinear):
        return int(weight.shape[0]), int(weight.shape[1]) * 32 // int(linear.bits)
    return int(weight.shape[0]), int(weight.shape[1])
