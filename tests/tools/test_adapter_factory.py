"""`mlx-nursery make-adapter`: an mlx-lm LoRA adapter directory, the same bytes for a seed,
with a non-zero `lora_b` so that it changes the model."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx

from mlx_nursery.cli import main


def test_make_adapter_writes_mlx_lms_layout_deterministically(
    tiny_model: Path, tmp_path: Path
) -> None:
    args = ["--base", str(tiny_model), "--seed", "3", "--rank", "4", "--layers", "1"]
    assert main(["make-adapter", str(tmp_path / "one"), *args, "--keys", "q_proj,up_proj"]) == 0
    assert main(["make-adapter", str(tmp_path / "two"), *args, "--keys", "q_proj,up_proj"]) == 0
    one, two = tmp_path / "one", tmp_path / "two"
    weights = (one / "adapters.safetensors").read_bytes()
    assert weights == (two / "adapters.safetensors").read_bytes()
    config = json.loads((one / "adapter_config.json").read_text())
    assert config == {
        "fine_tune_type": "lora",
        "num_layers": 1,
        "lora_parameters": {
            "rank": 4,
            "scale": 20.0,
            "dropout": 0.0,
            "keys": ["mlp.up_proj", "self_attn.q_proj"],
        },
    }
    arrays = mx.load(str(one / "adapters.safetensors"))
    assert isinstance(arrays, dict)
    last = json.loads((tiny_model / "config.json").read_text())["num_hidden_layers"] - 1
    assert sorted(arrays) == [
        f"model.layers.{last}.{key}.{part}"
        for key in ("mlp.up_proj", "self_attn.q_proj")
        for part in ("lora_a", "lora_b")
    ]
    assert all(
        array.shape[0 if name.endswith("lora_b") else 1] == 4 for name, array in arrays.items()
    )
    assert all(mx.any(array != 0).item() for array in arrays.values())
    reseeded = [a if a != "3" else "4" for a in args]
    assert (
        main(["make-adapter", str(tmp_path / "three"), *reseeded, "--keys", "q_proj,up_proj"]) == 0
    )
    assert (tmp_path / "three" / "adapters.safetensors").read_bytes() != weights
    assert main(["make-adapter", str(tmp_path / "none"), *args, "--keys", "nothing"]) == 2
