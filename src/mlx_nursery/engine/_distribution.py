"""The engine's seam for serving one model across devices (`mlx.launch`, distributed/).

On rank 0 the engine runs as on one device, with a `Distribution` in its config: it loads
the rank's shard of the model, agrees the KV budget with the other ranks, makes the batch
stepper (one that mirrors every insert, removal and step to the other ranks), is ticked
on every loop iteration (a heartbeat while idle), and is closed last (the other ranks
exit). Without one (the default) none of this runs: one device costs nothing more.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..models import LoadedModel
    from ._config import EngineConfig
    from ._kv_quant import CacheFactory
    from ._stepper import Stepper


class Distribution(Protocol):
    failure: str | None
    """Why the group cannot serve (a rank that failed or stalled), once it cannot."""

    def load(self, config: EngineConfig) -> LoadedModel:
        """Load this rank's shard and check that every rank serves the same model (raises
        if not). Engine thread; the first of its collectives."""

    def agree_kv_bytes(self, kv_bytes: int | None, per_token: int) -> int | None:
        """The KV memory, in this rank's bytes (`per_token` a token), for as many tokens as
        every rank can hold: each rank's own memory at its own cost a token (a pipeline
        rank holds only its layers' KV), the fewest of any (None: no limit on any)."""

    def batch_stepper(
        self, model: Any, config: EngineConfig, make_cache: CacheFactory | None
    ) -> Stepper:
        """A batch stepper whose every operation every rank applies in the same order."""

    def patient(self, seconds: float) -> AbstractContextManager[None]:
        """Within the block every rank waits up to `seconds` for the others (the warm-up,
        whose first steps compile kernels on every rank)."""

    def tick(self) -> None:
        """Once per loop iteration: a heartbeat when nothing was sent for a while."""

    def close(self, *, failed: bool) -> None:
        """The engine is ending: tell the other ranks to exit (non-zero if `failed`)."""
