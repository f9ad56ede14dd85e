"""Hypercorn's trio worker as `mlx-nursery serve` runs it: at most `--max-connections`
connections open, and HTTP/1.1 alone on its cleartext sockets.

Why not `hypercorn.trio.serve` as it is: it takes every connection that comes, and each holds
a file descriptor; past the process's limit every accept fails (EMFILE), a client with a key
included, and Hypercorn logs each failure. Its config has no bound on connections. And its
HTTP/1.1 protocol switches to HTTP/2 on a cleartext `Upgrade: h2c` or an HTTP/2 preface,
which its config cannot turn off either (docs/deployment.md, "Security model", says why we
do). So this module runs Hypercorn's own parts (its lifespan, its per-connection
`TCPServer`, its HTTP/1.1 protocol) with those two changes, and nothing else of its own:
timeouts, limits and shutdown are Hypercorn's, from its `Config`.

A connection past the cap is answered at once (a 503 in the envelope, `Retry-After: 1`) and
closed, so that a flood of connections costs the server no more than `--max-connections`
descriptors, and the soft limit on open files is raised at startup (`raise_open_files_limit`)
so that the cap, not the limit, is what a flood meets.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import h11
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState, LifespanState
from hypercorn.utils import ShutdownError, parse_socket_addr, raise_shutdown, repr_socket_addr

from ..serving import Metrics
from ._grace import Grace

log = logging.getLogger("mlx_nursery.server")

OPEN_FILES_RESERVE = 256
"""Descriptors beside the connections: listening sockets, model and cache files, the
responses store, worker threads' pipes, logs."""
_REFUSAL_SEND_S = 1.0
"""Seconds the 503 to a connection past the cap may take to go out."""
_SEND_PIECE = 64 << 10
"""Bytes of a response written under one send timeout: a client that reads slowly but
steadily (1 KiB/s or more under the default 60 s) takes a piece within it, however large the
body; a smaller piece costs the Trio thread a scheduler pass for every few KiB written."""


def _envelope(message: str, type_: str, code: str) -> bytes:
    """An error body in the API's envelope (no parameter named)."""
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    ).encode()


def _refusal(status: str, message: str, type_: str, code: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 answer, in the envelope, that closes its connection."""
    body = _envelope(message, type_, code)
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
    )
    return head.encode() + body


REFUSAL = _refusal(
    "503 Service Unavailable",
    "the server has as many connections open as it takes (--max-connections); retry shortly",
    "server_error",
    "too_many_connections",
    "retry-after: 1\r\n",
)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n"
"""How an HTTP/2 client with prior knowledge opens a connection (RFC 9113, 3.4)."""
HTTP2_REFUSAL = _refusal(
    "505 HTTP Version Not Supported",
    "HTTP/2 is served over TLS only; send HTTP/1.1",
    "invalid_request_error",
    "http_version_not_supported",
)


class ConnectionCap:
    """The connections open, at most `limit`; counted in `metrics`. Their response writes
    wait at most `send_timeout` for the client to take each piece (`_Connection`), and none
    outlasts the shutdown's grace (`writes_end_by`)."""

    def __init__(self, limit: int, metrics: Metrics, send_timeout: float) -> None:
        self.limit = limit
        self.open = 0
        self._metrics = metrics
        self.send_timeout = send_timeout
        self.writes: set[trio.CancelScope] = set()
        """The writes waiting on their clients now, each in a scope of its own."""
        self.last_write = math.inf
        """When every write must have ended (the shutdown's grace), once one is under way."""

    def writes_end_by(self, deadline: float) -> None:
        """End every write, those waiting now and any later, by `deadline` (Trio's clock):
        Hypercorn's writes are shielded, so the grace's cancellation alone would leave a
        connection whose client stopped reading open, and the process with it."""
        self.last_write = deadline
        for scope in self.writes:
            scope.deadline = min(scope.deadline, deadline)

    async def handle(
        self, stream: trio.SocketStream, serve: Callable[[trio.SocketStream], Awaitable[None]]
    ) -> None:
        """Serve `stream` with `serve`, or past the cap answer it 503 and close it.
        Cancellation: the connection is closed, as Hypercorn closes it."""
        if self.open >= self.limit:
            self._metrics.refused.labels("max_connections").inc()
            async with stream:
                # A client that left (or reset) first gets nothing; the server goes on.
                with (
                    trio.move_on_after(_REFUSAL_SEND_S),
                    contextlib.suppress(trio.BrokenResourceError, OSError),
                ):
                    await stream.send_all(REFUSAL)
            return
        self.open += 1
        self._metrics.connections_open.set(self.open)
        try:
            await serve(stream)
        finally:
            self.open -= 1
            self._metrics.connections_open.set(self.open)


_UNPARSED = {
    400: ("the request is not valid HTTP/1.1", "malformed_request"),
    431: ("the request's head is larger than the server takes", "request_headers_too_large"),
    501: ("the request's transfer coding is not one the server reads", "not_implemented"),
}
"""h11's refusals by status (its hint), as the envelope says them."""


class _HTTP11(H11Protocol):
    """Hypercorn's HTTP/1.1 that never switches to HTTP/2: an `Upgrade: h2c` is ignored (the
    request is answered in HTTP/1.1, as RFC 9110 lets a server do), and a connection that
    opens with HTTP/2's preface is answered 505 and closed before HTTP/1.1 parses it."""

    opened = False

    async def handle(self, event: Event) -> None:
        if isinstance(event, RawData) and not self.opened:
            self.opened = True
            if event.data.startswith(HTTP2_PREFACE):
                await self.send(RawData(HTTP2_REFUSAL))
                await self.send(Closed())
                return
        await super().handle(event)

    async def _check_protocol(self, event: h11.Request) -> None:
        return None  # a preface later than the first bytes is a request the app refuses

    async def _send_error_response(self, status_code: int) -> None:
        """What h11 cannot parse (a malformed request line or header, a head past the
        limit) is refused in the API's envelope, where Hypercorn sends an empty body."""
        message, code = _UNPARSED.get(status_code, _UNPARSED[400])
        body = _envelope(message, "invalid_request_error", code)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        events = (
            h11.Response(status_code=status_code, headers=headers),
            h11.Data(data=body),
            h11.EndOfMessage(),
        )
        data = b""
        for event in events:  # built whole, then one write: nothing can come between
            try:
                data += self.connection.send(event) or b""
            except h11.LocalProtocolError:  # e.g. a HEAD request's answer takes no body
                break
        if data:
            await self.send(RawData(data=data))


class _Connection(TCPServer):
    """Hypercorn's `TCPServer` on a cleartext socket (`serve` binds no TLS), with `_HTTP11`
    in place of its protocol switch, and two more changes. Once the client has closed the
    connection (or its reads failed), its keep-alive timer is stopped, so that the connection
    ends as soon as its requests have; Hypercorn's own waits the timer out, holding the
    socket (and, here, a place under the cap) for `keep_alive_timeout` after every client
    that closed an idle connection. And a write whose next piece (`_SEND_PIECE`) the client
    does not take within the cap's `send_timeout` (or by the shutdown's grace) closes the
    connection and stops reading it: Hypercorn's writes are shielded and unbounded, so a
    client that stopped reading held its connection, and a shutdown, for as long as it
    stayed connected. The rest (close) is Hypercorn's."""

    def __init__(self, cap: ConnectionCap, *args: Any) -> None:
        super().__init__(*args)
        self._cap = cap
        self._reading = trio.CancelScope()
        """The connection's read loop: cancelled once a write fails, so that a request the
        client pipelined behind it (h11 holds it paused until the answer before it has gone
        out, which it never will) does not keep the connection open."""

    async def protocol_send(self, event: Event) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        cap = self._cap
        stalled = False
        async with self.send_lock:
            try:
                with trio.CancelScope(shield=True):
                    data = memoryview(event.data)
                    for start in range(0, len(data), _SEND_PIECE):
                        deadline = min(trio.current_time() + cap.send_timeout, cap.last_write)
                        with trio.CancelScope(deadline=deadline) as writing:
                            cap.writes.add(writing)
                            try:
                                await self.stream.send_all(data[start : start + _SEND_PIECE])
                            finally:
                                cap.writes.discard(writing)
                        if writing.cancelled_caught:
                            stalled = True
                            break
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._reading.cancel()
                await self.protocol.handle(Closed())
                return
        if stalled:  # part of a piece may have gone out: the connection cannot go on
            log.info("a client took no piece of a response write in time; connection closed")
            self._reading.cancel()
            with trio.CancelScope(shield=True):
                await self.stream.aclose()
            await self.protocol.handle(Closed())

    async def run(self) -> None:
        socket = self.stream.socket
        try:
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with TaskGroup() as task_group:
                self._task_group = task_group
                self.protocol = _HTTP11(  # type: ignore[assignment]  # handle, initiate alike
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                )
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                with self._reading:
                    await self._read_data()
                await self.idle_task.stop()  # nothing more to read: nothing to time out
        except OSError:
            pass
        finally:
            await self._close()


async def serve_http(
    app: ASGIFramework,
    config: Config,
    cap: ConnectionCap,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    hurry_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `config.bind` until `shutdown_trigger` returns, as
    `hypercorn.trio.serve` does (lifespan startup first, the graceful timeout on the way
    out), with `cap` on connections and HTTP/1.1 only. Once `hurry_trigger` returns (an
    operator's second signal) the connections get `HURRIED_GRACE` seconds from then, or
    from the shutdown if it comes later, instead of the graceful timeout: enough to write
    the answers already decided (the requests' shutdown errors), not to wait on clients
    that read slowly. Reports the bound URLs."""
    wrapped = ASGIWrapper(app)
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    grace = Grace(config.graceful_timeout, cap)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            grace.scope = server_nursery.cancel_scope
            if hurry_trigger is not None:
                lifespan_nursery.start_soon(grace.hurry_on, hurry_trigger)
            sockets = config.create_sockets()
            listeners, binds = [], []
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                bind = repr_socket_addr(sock.family, sock.getsockname())
                binds.append(f"http://{bind}")
                await config.log.info(f"Running on http://{bind} (CTRL + C to quit)")
            connection = partial(
                _Connection, cap, wrapped, config, context, ConnectionState(lifespan_state.copy())
            )

            async def handle(stream: trio.SocketStream) -> None:
                try:
                    await cap.handle(stream, connection)
                except Exception:  # one connection's fault must not end the server's
                    log.exception("a connection failed; the server goes on")

            task_status.started(binds)
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    # The connections outlive the accept loop, up to the graceful timeout.
                    serving = partial(
                        trio.serve_listeners, handle, listeners, handler_nursery=server_nursery
                    )
                    nursery.start_soon(serving)
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others from None
            finally:
                await context.terminated.set()
                grace.begin()
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


def raise_open_files_limit(wanted: int) -> None:
    """Raise this process's soft limit on open files toward its hard limit (a process may,
    unprivileged), so that `wanted` descriptors (the connection cap, and the server's own)
    fit; log a warning where they still do not. Not a checkpoint; startup only."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    # An infinite hard limit (macOS) may still be refused past the kernel's own; `wanted`
    # is tried after it.
    tries = [hard] if hard != resource.RLIM_INFINITY else [max(wanted, 1 << 16)]
    tries += [wanted] if wanted < tries[0] else []
    for target in tries:
        if target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        soft = target
        break
    if soft < wanted:
        log.warning(
            "the limit on open files (%d) is below what --max-connections needs (%d):"
            " connections past it fail to be accepted; raise it (ulimit -n) or lower"
            " --max-connections",
            soft,
            wanted,
        )
