"""MLX's CUDA graphs switch, defaulted as this package is first imported.

MLX reads `MLX_USE_CUDA_GRAPHS` once per process, at the first kernel it encodes (unset
means on). The engine serves with graphs off by default (`EngineConfig.cuda_graphs`), and
its in-place KV writes (`engine/_kv_append.py`) are safe with graphs on only where the
writer's output is what the step reads next (the decode prelude): so the default is set
here, before anything of this package can run on the GPU, unless the operator set the
variable; and `known_off` records whether graphs are off for certain.
That is so where the operator set it to "0", or where it was set here before MLX had
allocated anything (so before it ran a kernel); if MLX had (a caller's own MLX work may
have read the variable unset), or the engine later changes the variable, it is not known.
This module does not load MLX: it asks MLX only if something loaded it before."""

from __future__ import annotations

import os
import sys

VARIABLE = "MLX_USE_CUDA_GRAPHS"


class _State:
    known_off = False


state = _State()


def default_off() -> None:
    """Set the variable to "0" unless it is set (called as the package is imported)."""
    before = os.environ.get(VARIABLE)
    if before is None:
        os.environ[VARIABLE] = "0"
        state.known_off = not _mlx_has_allocated()
    else:
        state.known_off = before == "0"


def _mlx_has_allocated() -> bool:
    """MLX is loaded and has allocated memory: it may have run a kernel already."""
    core = sys.modules.get("mlx.core")
    if core is None:
        return False
    try:
        return bool(core.get_peak_memory() > 0)
    except RuntimeError:  # no device to ask: nothing ran on it
        return False


def set_for_engine(on: bool) -> None:
    """Set the variable as an engine serves (`_backend.prepare_backend`); a change after
    MLX may have read it leaves the switch unknown, which keeps the in-place writes off."""
    value = "1" if on else "0"
    if os.environ.get(VARIABLE) != value:
        os.environ[VARIABLE] = value
        state.known_off = False
