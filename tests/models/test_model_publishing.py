"""A fetched model is put in place in one rename, so that readers never see half of one and
two processes fetching it at once (two servers, two test processes) both end up with one
complete model (`models/default.py`, `publish`)."""

from __future__ import annotations

from pathlib import Path

from mlx_nursery.models.default import publish


def _model(directory: Path, marker: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(marker)
    (directory / "model.safetensors").write_text(marker)
    return directory


def test_a_finished_conversion_takes_the_empty_place(tmp_path: Path) -> None:
    out = tmp_path / "model"
    publish(_model(tmp_path / "staged", "ours"), out)
    assert (out / "config.json").read_text() == "ours"
    assert not (tmp_path / "staged").exists()


def test_a_complete_model_already_there_is_kept(tmp_path: Path) -> None:
    """Another process finished first: its model stays, whole, and ours is dropped."""
    out = _model(tmp_path / "model", "theirs")
    publish(_model(tmp_path / "staged", "ours"), out)
    assert (out / "config.json").read_text() == "theirs"
    assert (out / "model.safetensors").read_text() == "theirs"


def test_an_incomplete_model_there_is_replaced(tmp_path: Path) -> None:
    """A conversion written in place that died left a config without weights."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("half")
    publish(_model(tmp_path / "staged", "ours"), out)
    assert (out / "config.json").read_text() == "ours"
    assert (out / "model.safetensors").read_text() == "ours"
