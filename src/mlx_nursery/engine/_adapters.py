"""LoRA adapters per request: which adapter each row of a forward runs with.

The adapters live in the loaded model (`models/_lora.py`: a bank of slots, and the
multi-adapter projections that read the current rows' slots). The steppers know each row's
uid; `RowAdapters` turns uids into slots and marks the forward they launch
(`RowAdapters.use`): `BatchStepper` around each decode step of its running batch and each
prefill chunk of its prompt batch (`_schedule.ServingBatchGenerator` calls it with the
batch's uids, in row order), `SoloStepper` around each step of its one sequence. A request's
adapter is resolved to its slot when a stepper takes the sequence (`slot`), so a handover or
a replay resolves it again, by name.

Loading and unloading run on the engine thread, between steps (`AdapterChange`, a command):
the slots change only while no forward is being built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from ..models import AdapterBank, AdapterError, LoadedModel
from ._errors import EngineError

if TYPE_CHECKING:
    from ._config import EngineConfig

log = logging.getLogger("mlx_nursery.engine")

__all__ = ["AdapterBank", "AdapterChange", "AdapterError", "RowAdapters", "UnknownAdapter"]


class UnknownAdapter(EngineError):
    """The request names an adapter the engine has not loaded (or no adapters are enabled)."""


class AdapterBusy(EngineError):
    """An adapter cannot be unloaded while requests use it."""


class AdaptersDisabled(EngineError):
    """Adapters cannot be loaded on this model (not enabled at its load, or not a text model)."""


@attrs.frozen
class AdapterChange:
    """A command: load the adapter at `path` as `name` (None: unload `name`). `done` is
    called on the engine thread with the adapter's bytes (0 for an unload) or the error."""

    name: str
    path: Path | None
    done: Callable[[int | BaseException], None]


class RowAdapters:
    """The steppers' view of the adapters: a sequence's slot, and the rows of a forward."""

    def __init__(self, bank: AdapterBank | None) -> None:
        self.bank = bank

    def slot(self, adapter: str | None) -> int:
        """The slot of `adapter` (0: the base). Raises UnknownAdapter if it is not loaded."""
        if adapter is None:
            return 0
        if self.bank is None or adapter not in self.bank.names:
            raise UnknownAdapter(f"the adapter {adapter!r} is not loaded")
        return self.bank.slot_of(adapter)

    def use(self, slots: Iterable[int]) -> AbstractContextManager[None]:
        """Mark the forwards built in the block as rows of `slots`, in batch order."""
        if self.bank is None:
            return nullcontext()
        return self.bank.rows.use(list(slots))

    def apply(self, change: AdapterChange) -> None:
        """Carry out `change` and report it to `change.done` (never raises: a failure is
        reported). Between steps only."""
        result: int | BaseException
        try:
            if self.bank is None:
                raise AdaptersDisabled("adapters are not enabled on this model")
            if change.path is None:
                if change.name not in self.bank.names:
                    raise UnknownAdapter(f"the adapter {change.name!r} is not loaded")
                self.bank.unload(change.name)
                result = 0
            else:
                result = self.bank.load(change.name, change.path)
        except (EngineError, AdapterError) as exc:
            result = exc
        except Exception as exc:  # noqa: BLE001 - reported to the caller; the engine serves on
            result = AdapterError(f"the adapter could not be loaded: {exc}")
        change.done(result)


def with_adapters(model: LoadedModel, config: EngineConfig) -> LoadedModel:
    """`model` with its adapter bank and the configured adapters loaded, where adapters are
    served (text models on one device only). Raises AdapterError. Engine thread."""
    if not config.serves_adapters:
        return model
    if model.kind != "lm" or model.model is None or config.distribution is not None:
        raise AdapterError("LoRA adapters are served on text models on one device only")
    bank = AdapterBank(model.model)
    for name, path in config.adapters:
        bank.load(name, path)
        log.info("LoRA adapter %s loaded (%d bytes)", name, bank.nbytes(name))
    return attrs.evolve(model, adapters=bank)


def adapter_bytes(model: LoadedModel) -> dict[str, int]:
    """The adapters `model` serves, by name: their bytes."""
    bank = model.adapters
    return {} if bank is None else {name: bank.nbytes(name) for name in bank.names}
