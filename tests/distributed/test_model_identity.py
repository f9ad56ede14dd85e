"""The model identity every rank compares before serving: config, weight file names and
contents, hashed several files at once."""

from __future__ import annotations

from pathlib import Path

from mlx_nursery.distributed._loading import model_identity


def _model(root: Path, shards: dict[str, bytes]) -> Path:
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "llama"}')
    for name, content in shards.items():
        (root / name).write_bytes(content)
    return root


def test_the_identity_follows_every_files_name_and_content(tmp_path: Path) -> None:
    shards = {f"model-{i:05d}.safetensors": bytes([i]) * (5 << 20) for i in range(1, 4)}
    same = model_identity(_model(tmp_path / "a", shards))
    assert model_identity(_model(tmp_path / "b", shards)) == same
    changed = {**shards, "model-00002.safetensors": b"\2" * (5 << 20) + b"\0"}
    assert model_identity(_model(tmp_path / "c", changed)) != same
    renamed = {k.replace("00003", "00009"): v for k, v in shards.items()}
    assert model_identity(_model(tmp_path / "d", renamed)) != same
    moved = dict(zip(shards, [shards[k] for k in reversed(list(shards))], strict=True))
    assert model_identity(_model(tmp_path / "e", moved)) != same  # contents under other names
