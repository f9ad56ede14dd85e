"""The tiny KittenTTS preset: offline, and the same bytes for the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mlx_nursery.models import model_facts
from mlx_nursery.tools import make_model


def test_tiny_tts_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    first, again, other = (
        make_model(tmp_path / name, "tiny-tts", seed=seed)
        for name, seed in (("a", 0), ("b", 0), ("c", 1))
    )
    for name in ("config.json", "model.safetensors", "voices.npz"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    config = json.loads((first / "config.json").read_text())
    assert config["model_type"] == "kitten_tts" and config["mlx_nursery_g2p"] == "graphemes"
    with np.load(first / "voices.npz") as voices:
        assert sorted(voices.files) == ["alloy", "echo", "fable", "nova"]
    facts = model_facts(first)
    assert facts.kind == "tts" and facts.voices == ("alloy", "echo", "fable", "nova")
