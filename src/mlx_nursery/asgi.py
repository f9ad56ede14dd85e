"""The ASGI app for `hypercorn -k trio mlx_nursery.asgi:app`, configured from `MLX_NURSERY_*`.

Hypercorn's own CLI handles signals itself: on SIGTERM it stops accepting
and cancels in-flight requests after its `--graceful-timeout`, without the
final in-stream error event that `mlx-nursery serve` sends.
"""

from __future__ import annotations

from .app import create_app
from .http._keepalive import ShieldFinalBody
from .settings import Settings

app = ShieldFinalBody(create_app(Settings.from_env()))
