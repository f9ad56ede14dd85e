"""The multi-adapter projections (models/_lora.py) against mlx-lm's own LoRA layers: each row
of a batch of the base and several adapters gives the logits mlx-lm's model with that one
adapter gives, on the checkpoint's projections and on projections fused at load."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.tuner.utils import load_adapters
from mlx_lm.utils import load_model

from mlx_nursery.models import AdapterBank, AdapterError
from mlx_nursery.models._fusing import fuse_projections
from mlx_nursery.tools import make_adapter

TOKENS = mx.array([[5, 17, 230, 41, 9, 88]])


def _logits(model: object, tokens: mx.array = TOKENS) -> mx.array:
    out: mx.array = model(tokens)  # type: ignore[operator]
    mx.eval(out)
    return out


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_each_row_of_a_batch_gets_mlx_lms_logits_for_its_adapter(
    tiny_model: Path, tmp_path: Path, fused: bool
) -> None:
    paths = {
        "a": make_adapter(tmp_path / "a", tiny_model, seed=5, rank=4, layers=2),
        "b": make_adapter(tmp_path / "b", tiny_model, seed=6, rank=8, layers=1, keys=("o_proj",)),
        "c": make_adapter(tmp_path / "c", tiny_model, seed=7, rank=2, keys=("up_proj", "q_proj")),
        "d": make_adapter(tmp_path / "d", tiny_model, seed=8, rank=4, keys=("k_proj",)),
    }
    expected: dict[str | None, mx.array] = {None: _logits(load_model(tiny_model)[0])}
    for name, path in paths.items():
        reference, _ = load_model(tiny_model)
        load_adapters(reference, str(path))
        expected[name] = _logits(reference)
    model, _ = load_model(tiny_model)
    if fused:  # q/k/v and gate/up as one matmul each: adapters add to their parts' slices
        assert fuse_projections(model).fused
    bank = AdapterBank(model)
    slots = {name: bank.load(name, paths[name]) and bank.slot_of(name) for name in "abc"}
    order: list[str | None] = [None, "a", "b", "c", "a", None]
    with bank.rows.use([0 if name is None else slots[name] for name in order]):
        batch = _logits(model, mx.concatenate([TOKENS] * len(order)))
    for row, name in enumerate(order):
        assert mx.allclose(batch[row], expected[name][0], atol=1e-4).item(), name
    for name in paths:
        assert not mx.allclose(expected[name], expected[None], atol=1e-2).item(), name
    assert mx.array_equal(_logits(model), expected[None]).item()  # outside a block: the base

    bank.unload("a")  # its slot goes to an adapter of layers new to the bank, which have
    bank.load("d", paths["d"])  # room for the slots above it; the others' stay theirs
    assert bank.slot_of("d") == slots["a"]
    with bank.rows.use([slots["a"], slots["c"], slots["b"]]):
        again = _logits(model, mx.concatenate([TOKENS] * 3))
    for row, name in enumerate("dcb"):
        assert mx.allclose(again[row], expected[name][0], atol=1e-4).item(), name


def test_an_adapter_of_another_model_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    path = make_adapter(tmp_path / "a", tiny_model, seed=1)
    weights = mx.load(str(path / "adapters.safetensors"))
    assert isinstance(weights, dict)
    weights = {k: mx.concatenate([v, v]) if k.endswith("lora_a") else v for k, v in weights.items()}
    mx.save_safetensors(str(path / "adapters.safetensors"), weights)
    bank = AdapterBank(load_model(tiny_model)[0])
    with pytest.raises(AdapterError, match="does not fit"):
        bank.load("a", path)
    assert bank.names == []
