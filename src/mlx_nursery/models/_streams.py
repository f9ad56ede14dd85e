"""MLX's per-thread streams, released before a thread (or the process) ends."""

from __future__ import annotations

import sys


def release_mlx_streams() -> None:
    """Destroy this thread's MLX streams; MLX aborts at exit otherwise (ml-explore/mlx#4327).

    Call it last: this thread can make no MLX call afterwards. Without MLX imported there is
    nothing to release, and MLX is not imported for it."""
    if "mlx.core" in sys.modules:
        import mlx.core as mx

        mx.synchronize()
        mx.clear_streams()
