"""A rank's shard of the model: which architectures can be split, loading only this rank's
weights, and the model's identity that every rank checks before serving.

Tensor parallel splits every layer's attention heads and MLP across the ranks (mlx-lm's
`Model.shard(group)`); pipeline parallel gives each rank a run of layers
(`model.model.pipeline(group)`). Which architectures have them is mlx-lm's to say: both
are read from its model classes, never listed here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Literal

import mlx.core as mx

from ..models import LoadedModel, ModelLoadError, model_kind
from ._channel import Channel
from ._watchdog import FIRST_MEETING_S

log = logging.getLogger("mlx_nursery.distributed")

Mode = Literal["tensor", "pipeline"]
MODES: tuple[Mode, ...] = ("tensor", "pipeline")
_HASH_BLOCK = 1 << 22
_HASH_THREADS = 8
"""Weight files hashed at once."""


def _file_digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.digest()


class UnsupportedModel(ModelLoadError):
    """This model cannot be served across devices in the mode asked (refused at startup)."""


def check_supported(path: Path, mode: Mode) -> None:
    """Raise `UnsupportedModel` unless mlx-lm can split `path`'s text model in `mode`.
    Reads the config and imports the architecture's module; loads no weights."""
    kind = model_kind(path)
    if kind != "lm":
        raise UnsupportedModel(
            f"{path}: a {_KIND_NAMES.get(kind, kind)} is not served across devices; only"
            " mlx-lm text models are"
        )
    from mlx_lm.utils import _get_classes

    config = json.loads((path / "config.json").read_text("utf-8"))
    try:
        model_class, _ = _get_classes(config)
    except ValueError as exc:
        raise UnsupportedModel(f"{path}: mlx-lm does not know this model ({exc})") from exc
    if not _splits(model_class, mode):
        raise UnsupportedModel(
            f"{path}: mlx-lm's {config.get('model_type')!r} model has no {mode} parallelism;"
            f" --distributed {mode} serves: {', '.join(supported_architectures(mode))}"
        )


_KIND_NAMES = {
    "vlm": "vision-language model",
    "scripted": "scripted model",
    "embedding": "embedding model",
    "reranker": "cross-encoder",
    "stt": "speech-to-text model",
    "tts": "text-to-speech model",
}


def _splits(model_class: type, mode: Mode) -> bool:
    if mode == "tensor":
        return hasattr(model_class, "shard")
    from mlx_lm.models.pipeline import PipelineMixin

    module = vars(sys.modules[model_class.__module__])
    return any(
        isinstance(c, type) and c is not PipelineMixin and issubclass(c, PipelineMixin)
        for c in module.values()
    )


@cache
def supported_architectures(mode: Mode) -> tuple[str, ...]:
    """mlx-lm's model types that split in `mode`, read from its model sources (no imports)."""
    import mlx_lm.models

    marker = re.compile(r"def shard\(" if mode == "tensor" else r"\(PipelineMixin\b")
    folder = Path(mlx_lm.models.__file__).parent
    return tuple(
        sorted(
            f.stem
            for f in folder.glob("*.py")
            if f.stem != "pipeline" and marker.search(f.read_text("utf-8"))
        )
    )


def load_shard(path: Path, mode: Mode, group: mx.distributed.Group) -> LoadedModel:
    """This rank's part of `path`'s model: built lazily, split, then only its own weights
    evaluated (pipeline: its layers'; tensor: its slices). Makes MLX calls: engine thread
    (rank 0) or the follower's one thread."""
    from mlx_lm.utils import load_model, load_tokenizer

    check_supported(path, mode)
    model, config = load_model(path, lazy=True)
    if mode == "tensor":
        model.shard(group)
    else:
        model.model.pipeline(group)
    mx.eval(model.parameters())
    tokenizer = load_tokenizer(path, None, eos_token_ids=config.get("eos_token_id"))
    return LoadedModel(path=path, kind="lm", model=model, tokenizer=tokenizer, config=config)


def model_identity(path: Path) -> list[int]:
    """A digest of the model's config and weight files (names and contents), as four
    int64s: what every rank compares before serving. Reads every weight file, several at
    once (hashlib releases the GIL): a large model's shards take one core's hashing rate
    each (one after another, a 70B model's 70 GB was a large part of its loading)."""
    digest = hashlib.sha256()
    digest.update((path / "config.json").read_bytes())
    files = sorted(path.glob("*.safetensors"))
    with ThreadPoolExecutor(max_workers=max(1, min(len(files), _HASH_THREADS))) as pool:
        for weights, file_digest in zip(files, pool.map(_file_digest, files), strict=True):
            digest.update(weights.name.encode() + b"\0" + file_digest)
    raw = digest.digest()
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, 32, 8)]


def check_identity(gathered: list[list[int]], path: Path) -> None:
    """Raise `ModelLoadError` unless every rank's identity (by rank) is the same."""
    differing = [rank for rank, row in enumerate(gathered) if row != gathered[0]]
    if differing:
        raise ModelLoadError(
            f"{path}: rank(s) {', '.join(map(str, differing))} serve a model whose config or"
            " weights differ from rank 0's; every rank must serve the same model files"
        )


def meet_on_the_model(channel: Channel, path: Path) -> None:
    """Every rank's first meeting, once its shard is loaded: raise `ModelLoadError` unless
    every rank serves the same model files. Waits up to `FIRST_MEETING_S` for the slowest
    rank's load, not the step bound. Blocks; not cancellable."""
    identity = model_identity(path)
    log.info("rank %d: model loaded; waiting for every rank to load it", channel.rank)
    with channel.watchdog.at_least(FIRST_MEETING_S):
        check_identity(channel.gather(identity, "the model check"), path)
