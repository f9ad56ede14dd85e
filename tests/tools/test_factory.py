"""`make_model`'s quantized text models: what mlx-lm loads as quantized, drawn shard by shard."""

from __future__ import annotations

from pathlib import Path

import mlx.nn as nn
import pytest

from mlx_nursery.models import load_model
from mlx_nursery.tools import make_model


def test_a_quantized_preset_loads_with_every_projection_quantized(tmp_path: Path) -> None:
    path = make_model(tmp_path / "q8", "small", bits=8, seed=3)
    again = make_model(tmp_path / "again", "small", bits=8, seed=3)
    assert (path / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()
    loaded = load_model(path, fuse_weights=False)
    layer = loaded.model.model.layers[0]
    for projection in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.down_proj):
        assert isinstance(projection, nn.QuantizedLinear)
        assert projection.bits == 8 and projection.group_size == 64
    assert isinstance(loaded.model.model.embed_tokens, nn.QuantizedEmbedding)


@pytest.mark.parametrize(("preset", "bits"), [("small", 3), ("tiny-embedding", 8)])
def test_bits_a_preset_cannot_take_are_refused(tmp_path: Path, preset: str, bits: int) -> None:
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        make_model(tmp_path / "m", preset, bits=bits)
