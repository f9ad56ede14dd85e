"""Starting a process of an `mlx.launch` group: refusals, its role by rank, rank 0's leader.

`mlx-nursery serve --distributed tensor|pipeline` on every rank: rank 0 goes on to serve
HTTP (its engine with a `Leader`); every other rank runs `run_follower` instead.
"""

from __future__ import annotations

import logging
import time
from functools import cache
from typing import cast

import attrs
import trio

from ..engine import Engine
from ..settings import Settings, SettingsError
from ._leader import Leader
from ._loading import Mode

log = logging.getLogger("mlx_nursery.distributed")

REPORT_GRACE_SECONDS = 2.0
"""After a stall, how long rank 0 keeps answering (/health 503, error events written)
before it exits."""


def distributed_settings(settings: Settings) -> Settings:
    """`settings` as distributed serving runs them: one model, no prefix cache in memory or
    on disk (a hit is KV on rank 0 alone), no restart of a dead engine (the group restarts
    together). Raises SettingsError for what it refuses."""
    if settings.distributed is None:
        return settings
    if len(settings.model) != 1 or settings.models_dir is not None:
        raise SettingsError("--distributed serves one model: give exactly one --model")
    if settings.script is not None or settings.fault_rate > 0:
        raise SettingsError("--distributed serves a real model; --script and faults are not")
    return attrs.evolve(
        settings,
        prompt_cache_bytes=0,
        prompt_cache_dir=None,
        on_engine_failure="exit",
        max_loaded_models=1,
    )


def start_rank(settings: Settings, spec: str | None) -> int | None:
    """Join the group serving the model `spec` names (the one model source of `settings`;
    None: none was given): on rank 0 return None (serve HTTP); elsewhere run the follower
    and return its exit status. Raises SettingsError for a model or group that cannot serve."""
    import mlx.core as mx

    from ..models import ModelLoadError, resolve_model_path
    from ._follower import Backend, run_follower
    from ._loading import check_supported

    mode = cast(Mode, settings.distributed)
    if spec is None:
        raise SettingsError("--distributed needs --model")
    path = resolve_model_path(spec)
    try:
        check_supported(path, mode)
    except ModelLoadError as exc:
        raise SettingsError(str(exc)) from exc
    backend = Backend(
        cudnn_attention=settings.cudnn_attention,
        cuda_graphs=settings.cuda_graphs,
        ragged_attention=not settings.no_ragged_attention,
    )
    backend.prepare()  # every rank, before the group forms (rank 0's engine sets the same)
    group = mx.distributed.init()
    if group.size() < 2:
        raise SettingsError(
            "--distributed runs under `mlx.launch` with two ranks or more"
            " (e.g. mlx.launch -n 2 --backend ring -- mlx-nursery serve ...)"
        )
    if group.rank() == 0:
        return None
    return run_follower(path, mode, settings.distributed_timeout, backend)


@cache
def leader(mode: Mode, timeout: float) -> Leader:
    """Rank 0's leader (one group per process)."""
    import mlx.core as mx

    return Leader(mode, mx.distributed.init(), timeout)


def report_to(engine: Engine, leader: Leader) -> None:
    """Have `leader` report a stalled group through `engine` (from its watchdog thread):
    every request ends with the error, /health names the rank, then the process exits."""
    token = trio.lowlevel.current_trio_token()

    def report(detail: str) -> None:
        try:
            trio.from_thread.run_sync(engine.fail_all, detail, trio_token=token)
        except trio.RunFinishedError:
            return
        time.sleep(REPORT_GRACE_SECONDS)  # the clients read their error, /health its 503

    leader.report = report
