"""The ASGI app for `hypercorn -k trio mlx_nursery.asgi:app`, configured from `MLX_NURSERY_*`.

It logs as `mlx-nursery serve` does (model loads, the request log, at
`MLX_NURSERY_LOG_LEVEL`, in `MLX_NURSERY_LOG_FORMAT`), to stderr through a handler of its own
on the `mlx_nursery` logger: Hypercorn's CLI configures only its own loggers, and without it
every info line was dropped. A Hypercorn `--log-config` that names `mlx_nursery` takes over.

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
from .logs import configure_logging
from .settings import Settings
from .testing import harness

_settings = Settings.from_env()
configure_logging(_settings.log_level, _settings.log_format, name="mlx_nursery")
app = asgi_app(create_app(_settings, extensions=(harness(_settings),)))
