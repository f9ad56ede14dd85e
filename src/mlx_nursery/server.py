"""Run the app under Hypercorn's trio worker, with a graceful SIGTERM/SIGINT drain.

On a signal the server drains: it keeps accepting connections while running
requests get `shutdown_grace` seconds to finish, and meanwhile answers /health
and every new request with a 503 (so a load balancer learns of the drain);
then their jobs are cancelled and each gets a final error (an in-stream event
for streams), Hypercorn stops accepting, the engine threads are joined when
the app's nursery closes, and the process exits 0. A shared part that fails
for good (an engine past its restarts) stops the server the same way, with
exit status 1.

Hypercorn's parts run with a cap on connections and HTTP/1.1 only (http/_connections.py).
"""

from __future__ import annotations

import ipaddress
import logging
import signal
from collections.abc import Sequence
from typing import cast

import attrs
import trio
from hypercorn.config import Config
from hypercorn.typing import ASGIFramework

from .app import asgi_app, create_app
from .http import (
    HYPERCORN_HEAD_BYTES,
    OPEN_FILES_RESERVE,
    AccessPolicy,
    ConnectionCap,
    raise_open_files_limit,
    serve_http,
)
from .serving import Extension, Parts, Service
from .settings import Settings, SettingsError

log = logging.getLogger("mlx_nursery.server")


@attrs.frozen
class Running:
    urls: list[str]
    service: Service
    """The served models and the server's state."""
    parts: Parts
    """Every part the app serves with (app.py's composition root)."""

    @property
    def base_url(self) -> str:
        return self.urls[0]


_HYPERCORN_MARGIN = (
    5.0  # Hypercorn's own grace outlasts ours: our jobs end first, with an error event
)


_SETTLE_AFTER_HURRY = 10.0
"""Seconds a second signal waits for the requests it cancelled to decide their final answers
before the connections' grace is cut short."""


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.graceful_timeout = settings.shutdown_grace + _HYPERCORN_MARGIN
    config.keep_alive_timeout = 5
    config.h11_max_incomplete_size = HYPERCORN_HEAD_BYTES  # ours are lower, in the envelope
    config.startup_timeout = 600  # the default model may be fetched and converted at first start
    config.accesslog = (
        logging.getLogger("mlx_nursery.access") if settings.log_level == "debug" else None
    )
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


async def serve(
    settings: Settings,
    *,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    extensions: Sequence[Extension] = (),
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Serve until SIGTERM/SIGINT (or `shutdown` is set).

    `task_status` reports a `Running` once the port is bound and the model is loaded
    (or failed to load, which ends the server). `extensions`: as `create_app`'s.

    Returns the exit status: 0 after a shutdown, 1 when the model failed to load or a
    shared part failed for good (`Service.stopped_by_failure`).
    """
    app = create_app(settings, extensions=extensions)
    parts: Parts = app.extensions["mlx_nursery"]
    service = parts.service
    raise_open_files_limit(settings.max_connections + OPEN_FILES_RESERVE)
    access: AccessPolicy = app.extensions["mlx_nursery.access"]
    _warn_if_open(settings, access)
    shutdown = trio.Event() if shutdown is None else shutdown
    hurry = trio.Event()
    stop_accepting = trio.Event()
    failed = trio.Event()

    async def drain_on_shutdown() -> None:
        await shutdown.wait()
        log.info("shutting down: draining for up to %g s", settings.shutdown_grace)
        async with trio.open_nursery() as draining:

            async def cut_short() -> None:
                await hurry.wait()
                log.info("a second signal: the requests still running are cancelled now")
                await service.end_grace()

            draining.start_soon(cut_short)
            await service.drain(settings.shutdown_grace)  # still accepting: new requests get 503
            draining.cancel_scope.cancel()
        stop_accepting.set()

    async def stop_if_load_fails() -> None:
        await service.ready.wait()
        if service.state == "failed":
            shutdown.set()

    async def stop_on_failure() -> None:
        await service.stopped_by_failure.wait()
        failed.set()
        shutdown.set()

    async def hurried() -> None:
        """A second signal, once the requests it cancelled have decided their final answers
        (the engine acknowledges a cancel within a step; bounded): the connections' grace
        then ends soon, without cutting those answers off."""
        await hurry.wait()
        await service.settled(_SETTLE_AFTER_HURRY)

    async def run_hypercorn(*, task_status: trio.TaskStatus[list[str]]) -> None:
        await serve_http(
            cast(ASGIFramework, asgi_app(app)),
            hypercorn_config(settings),
            ConnectionCap(settings.max_connections, parts.metrics, settings.send_timeout),
            shutdown_trigger=stop_accepting.wait,
            hurry_trigger=hurried,
            task_status=task_status,
        )
        nursery.cancel_scope.cancel()  # Hypercorn is done: stop the watchers

    async with trio.open_nursery() as nursery:
        if handle_signals:
            nursery.start_soon(_signals_to, shutdown, hurry)
            nursery.start_soon(_reload_keys_on_sighup, access)
        nursery.start_soon(drain_on_shutdown)
        nursery.start_soon(stop_if_load_fails)
        nursery.start_soon(stop_on_failure)
        urls = await nursery.start(run_hypercorn)
        await service.ready.wait()
        task_status.started(Running(urls, service, parts))
    return 1 if service.state == "failed" or failed.is_set() else 0


def _warn_if_open(settings: Settings, access: AccessPolicy) -> None:
    """Say so where the API is served without a key beyond this machine."""
    if not access.current.api_open:
        return
    try:
        local = ipaddress.ip_address(settings.host).is_loopback
    except ValueError:
        local = settings.host == "localhost"
    if not local:
        log.warning(
            "serving the API on %s without a key: anyone who can reach it may use it"
            " (--api-key, --api-key-file)",
            settings.host,
        )


async def _reload_keys_on_sighup(access: AccessPolicy) -> None:
    """SIGHUP re-reads the API key file (a rotated key without a restart); a file that
    cannot serve is logged and the keys in force stay."""
    if not hasattr(signal, "SIGHUP"):
        return
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            try:
                access.reload()
            except SettingsError as exc:
                log.error("SIGHUP: the API keys were not reloaded: %s", exc)
            else:
                log.info("SIGHUP: API keys reloaded (%d)", len(access.current.keys))


async def _signals_to(shutdown: trio.Event, hurry: trio.Event) -> None:
    """The first SIGTERM or SIGINT starts the drain; a later one ends its grace at once (the
    requests still running get their shutdown error, the connections a second to write what
    is decided, and the server exits 0 as after any drain). The receiver stays open: a
    repeated signal never falls to the default handler, which would kill the process
    mid-write."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s", signal.Signals(signum).name)
            if shutdown.is_set():
                hurry.set()
            shutdown.set()
