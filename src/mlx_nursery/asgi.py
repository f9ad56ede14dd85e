"""The ASGI app for `hypercorn -k trio mlx_nursery.asgi:app`, configured from `MLX_NURSERY_*`.

Hypercorn's own CLI handles signals itself: on SIGTERM it stops accepting
and cancels in-flight requests after its `--graceful-timeout`, without the
final in-stream error event that `mlx-nursery serve` sends. Its `h11_max_incomplete_size`
(16 KiB unless a `--config` file sets it; `serve` sets 64 KiB) then bounds the request head
before our limits do (http/_limits.py), answering 431 with an empty body. And its connections
are Hypercorn's: no `--max-connections` cap, and cleartext HTTP/2 is switched to (the app
then answers each such request 505) rather than refused (http/_connections.py). What the app
does itself holds either way: keys, bodies' pace, WebSocket refusals, escaped logs.
"""

from __future__ import annotations

from .app import asgi_app, create_app
from .settings import Settings

app = asgi_app(create_app(Settings.from_env()))
