"""LoRA adapters as served models: each a name clients request, run on its base model's
engine with the adapter (engine/_adapters.py), listed in /v1/models with its base as
`parent` and `root` (vLLM's fields).

Adapters come from `--lora NAME=PATH` (repeatable; `--enable-lora` without any), and load
and unload at runtime by the admin routes vLLM names (`/v1/load_lora_adapter`,
`/v1/unload_lora_adapter`). They attach to the server's one text model: `--lora` beside
several models is refused at startup. The list here is what is served: a base model that
loads (or loads again after an unload) loads every adapter listed with it.

Memory: an adapter's bytes (its matrices, as the engine holds them) are added to its base
model's reservation (`Reservation.adapters`), and a runtime load that would take the loaded
models past `--memory-budget` is refused with 503 `insufficient_memory`. The base's KV budget
is not shrunk for them: adapters are small beside it (a rank-8 adapter of q and v on every
layer of an 8B Llama holds about 14 MB in float32) and are counted on top.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import trio

from ..engine import (
    AdapterBusy,
    AdapterError,
    AdaptersDisabled,
    Engine,
    EngineUnavailable,
    UnknownAdapter,
)
from ..generation import (
    Conflict,
    InvalidRequest,
    ModelCard,
    Unavailable,
    quoted,
    unknown_model,
)
from ..settings import Settings, SettingsError
from ._reservations import insufficient
from ._slots import ModelSlot


def _parse(entry: str) -> tuple[str, Path]:
    name, sep, path = entry.partition("=")
    if not sep or not name or not path:
        raise SettingsError(f"--lora takes NAME=PATH, not {entry!r}")
    return name, Path(path).expanduser()


@attrs.define
class LoraAdapters:
    """The adapters served, by name: their directories (the order they were added)."""

    enabled: bool
    paths: dict[str, Path] = attrs.field(factory=dict)
    created: dict[str, int] = attrs.field(factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> LoraAdapters:
        """Raises SettingsError for an entry that is not NAME=PATH, or a name given twice."""
        adapters = cls(settings.enable_lora or bool(settings.lora))
        for entry in settings.lora:
            name, path = _parse(entry)
            if name in adapters.paths:
                raise SettingsError(f"two adapters are served as {name!r}")
            adapters.paths[name] = path
            adapters.created[name] = int(time.time())
        return adapters

    def cards(self, base: ModelSlot) -> list[ModelCard]:
        """The adapters' model cards: the base's, named as each adapter, with its parent."""
        card = base.card()
        return [
            attrs.evolve(card, id=name, created=self.created[name], root=card.id, parent=card.id)
            for name in self.paths
        ]

    async def load(
        self, slot: ModelSlot, engine: Engine, name: str, path: Path, room: int | None
    ) -> int:
        """Load adapter `name` from `path` on `slot`'s loaded model and serve it; its bytes.
        Raises 400 (adapters not enabled, a name taken by a model, files that are no adapter
        of this model), 409 (one of that name is in use), 503 (past the `room` the memory
        budget leaves, or the engine stopped). Cancellation: as `Engine.load_adapter`."""
        if name == slot.source.name or name in slot.source.aliases:
            raise InvalidRequest(
                f"{quoted(name)} names the base model", param="lora_name", code="invalid_value"
            )
        if room is not None and await trio.to_thread.run_sync(_file_bytes, path) > room:
            raise insufficient(f"the adapter {quoted(name)} does not fit the memory budget")
        with _as_api_errors(name):
            nbytes = await engine.load_adapter(name, path)
        self.paths[name] = path
        self.created[name] = int(time.time())
        hosted = slot.hosted
        if hosted is not None:  # counted in its base's reservation
            held = hosted.reservation
            slot.hosted = attrs.evolve(
                hosted, reservation=attrs.evolve(held, adapters=sum(engine.adapters.values()))
            )
        return nbytes

    async def unload(self, slot: ModelSlot, engine: Engine | None, name: str) -> None:
        """Stop serving adapter `name` (and free it on the loaded model, `engine`). Raises
        404 for an adapter not served, 409 while a request of it runs. Cancellation: as
        `Engine.unload_adapter`."""
        if name not in self.paths:
            raise unknown_model(name, list(self.paths))
        if engine is not None:
            with _as_api_errors(name):
                await engine.unload_adapter(name)
        del self.paths[name]
        self.created.pop(name, None)
        hosted = slot.hosted
        if hosted is not None and engine is not None:
            held = hosted.reservation
            slot.hosted = attrs.evolve(
                hosted, reservation=attrs.evolve(held, adapters=sum(engine.adapters.values()))
            )


def _file_bytes(path: Path) -> int:
    try:
        return (path / "adapters.safetensors").stat().st_size
    except OSError:
        return 0  # the engine's load says what is wrong with it


@contextmanager
def _as_api_errors(name: str) -> Iterator[None]:
    """The engine's adapter errors from the block as the API's. Not a checkpoint."""
    try:
        yield
    except UnknownAdapter:
        raise unknown_model(name, []) from None
    except AdapterBusy as exc:
        raise Conflict(str(exc), param="lora_name", code="adapter_busy") from None
    except (AdaptersDisabled, AdapterError) as exc:
        raise InvalidRequest(str(exc), param="lora_path", code="invalid_adapter") from None
    except EngineUnavailable as exc:
        raise Unavailable(str(exc), code="server_unavailable") from None
