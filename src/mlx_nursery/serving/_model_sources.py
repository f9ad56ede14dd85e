"""Which models a server serves, and under which names: from `--model` (repeatable,
`PATH[=NAME]`), `--models-dir`, or the built-in default when neither is given.

Nothing is loaded or even resolved here (a repo id is looked up in the Hugging Face cache
only when its model loads): the names are what clients send as `model`. A model given by a
path is named by its served name alone, never by a path: a path taken as a name would tell a
client which directories the server has (and echo them back).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from ..settings import Settings, SettingsError


@attrs.frozen
class ModelSource:
    """One served model: the name clients use, where it comes from, and other names for it."""

    name: str
    spec: str | None
    """A directory or a cached repo id, as given; None: the built-in default model."""
    aliases: frozenset[str] = frozenset()
    """Other names a request may use ("default", for the built-in model)."""


def model_sources(settings: Settings) -> list[ModelSource]:
    """The served models, in the order given. Raises SettingsError for two models under one
    name, a `--served-model-name` beside several models, or a models dir that is not one."""
    sources = [_from_flag(entry) for entry in settings.model]
    if settings.models_dir is not None:
        sources += _from_dir(Path(settings.models_dir).expanduser())
    if not sources:
        from ..models.default import DEFAULT_MODEL_NAME

        sources = [ModelSource(DEFAULT_MODEL_NAME, None, frozenset({"default"}))]
    if settings.served_model_name is not None:
        if len(sources) > 1:
            raise SettingsError(
                "--served-model-name names one model; with several, name each as PATH=NAME"
            )
        source = sources[0]
        sources = [attrs.evolve(source, name=settings.served_model_name)]
    seen: dict[str, int] = {}
    for index, source in enumerate(sources):
        for name in (source.name, *source.aliases):
            if seen.setdefault(name, index) != index:
                raise SettingsError(f"two models are served as {name!r}")
    _check_adapters(settings, seen)
    return sources


def _check_adapters(settings: Settings, models: Mapping[str, int]) -> None:
    """Raises SettingsError for `--lora` beside several models (adapters attach to the one
    text model), an entry that is not NAME=PATH, or an adapter named as a model."""
    from ._adapters import LoraAdapters

    adapters = LoraAdapters.from_settings(settings)
    if adapters.enabled and len(set(models.values())) != 1:
        raise SettingsError("--lora and --enable-lora serve adapters on one model: give one")
    for name in adapters.paths:
        if name in models:
            raise SettingsError(f"the adapter {name!r} has a served model's name")


def _from_flag(entry: str) -> ModelSource:
    """`PATH=NAME` (served as NAME alone: one directory may be served under two names; NAME
    may hold '/', as `org/tiny-chat` does) or `PATH` (served as its directory's name; a repo
    id as itself). An entry that names an existing path is a PATH, '=' in it or not."""
    spec, sep, name = entry.rpartition("=")
    if sep and spec and name and not Path(entry).expanduser().exists():
        return ModelSource(name, spec)
    return ModelSource(_public_name(entry), entry)


def _public_name(spec: str) -> str:
    """A directory's name, or the repo id as given."""
    path = Path(spec).expanduser()
    return path.name if path.exists() else spec


def _from_dir(folder: Path) -> list[ModelSource]:
    if not folder.is_dir():
        raise SettingsError(f"--models-dir {folder} is not a directory")
    found = sorted(p for p in folder.iterdir() if (p / "config.json").is_file())
    if not found:
        raise SettingsError(f"--models-dir {folder} holds no model directory (with config.json)")
    return [ModelSource(p.name, str(p)) for p in found]
