"""Resolve and load models without ever reaching a model hub.

A model is a local directory (mlx-lm layout) or a repo id already present in
the local Hugging Face cache. Loading dispatches on the model's kind so that
mlx-vlm models can plug in beside mlx-lm ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs

ModelKind = Literal["lm", "vlm"]


class ModelNotFoundError(LookupError):
    """No model at the given path, nor in the local Hugging Face cache."""


class ModelLoadError(RuntimeError):
    """The model exists but cannot be loaded (unsupported kind, broken files)."""


@attrs.frozen
class LoadedModel:
    """A model and its tokenizer, loaded on (and only to be used from) the engine thread."""

    path: Path
    kind: ModelKind
    model: Any  # mlx.nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    config: dict[str, Any]

    @property
    def context_length(self) -> int:
        for key in ("max_position_embeddings", "max_seq_len", "n_ctx"):
            if isinstance(self.config.get(key), int):
                return int(self.config[key])
        return int(getattr(self.tokenizer, "model_max_length", 4096))


def resolve_model_path(spec: str | Path) -> Path:
    """Return a local directory for `spec`, a path or a cached `org/name` repo id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory but has no config.json")
        return path.resolve()
    looked = [f"path {path.resolve()}"]
    repo = str(spec)
    if repo.count("/") == 1 and not repo.startswith((".", "/", "~")):
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        looked.append(f"Hugging Face cache {constants.HF_HUB_CACHE} (repo {repo})")
        try:
            return Path(snapshot_download(repo, local_files_only=True))
        except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
            pass
    raise ModelNotFoundError(
        f"model {spec!r} not found; looked at: {'; '.join(looked)}. "
        "Models are never downloaded: pass a local directory or pre-populate the cache."
    )


def model_kind(path: Path) -> ModelKind:
    config = json.loads((path / "config.json").read_text("utf-8"))
    return "vlm" if "vision_config" in config else "lm"


def _load_lm(path: Path) -> LoadedModel:
    from mlx_lm.utils import load

    model, tokenizer, config = load(str(path), return_config=True)
    return LoadedModel(path=path, kind="lm", model=model, tokenizer=tokenizer, config=config)


def _load_vlm(path: Path) -> LoadedModel:
    raise ModelLoadError(f"{path} is a vision-language model; mlx-vlm support is not available yet")


_LOADERS: dict[ModelKind, Callable[[Path], LoadedModel]] = {"lm": _load_lm, "vlm": _load_vlm}


def load_model(spec: str | Path) -> LoadedModel:
    """Resolve and load a model. Makes MLX calls: call it on the engine thread."""
    path = resolve_model_path(spec)
    return _LOADERS[model_kind(path)](path)
