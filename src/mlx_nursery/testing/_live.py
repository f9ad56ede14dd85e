"""A real server on its own thread, for tests of client code (issue 21).

The server runs in its own `trio.run` on a thread of its own, so that a plain test, a
pytest-trio test and an asyncio/anyio test can all call it, and none of their event loops
has to host it. What it saw is read on its Trio thread (`LiveServer.report`), through its
`TrioToken`: the engine's statistics and the metrics belong to that thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import trio

if TYPE_CHECKING:
    import openai

    from ..server import Running
    from ..serving import Parts
    from ..settings import Settings

from ._report import CancelCause, ServerReport, read_report

T = TypeVar("T")

DEFAULT_SETTINGS: Mapping[str, Any] = {
    "host": "127.0.0.1",
    "port": 0,
    "responses_db": ":memory:",
    "shutdown_grace": 0.0,
}
"""What a test server changes from the CLI's defaults: a free port, no responses file, and
no grace at shutdown (a stream a test left open ends at once, with an error event)."""

_READ_TIMEOUT = 30.0  # a read of the server's state waits this long for its Trio thread


class LiveServer:
    """A running server: its URL, openai clients for it, and what it saw.

    Made by `start_server`. Every method may be called from any thread but the server's
    own, from sync code or from inside any event loop: reads block the caller for as long
    as the server's Trio thread takes to answer (microseconds when idle). After the server
    has stopped, reads return its last state."""

    def __init__(self, runner: _Runner, running: Running, model: str) -> None:
        self._runner = runner
        self._parts: Parts = running.parts
        self.base_url: str = running.base_url
        """`http://127.0.0.1:PORT`."""
        self.model = model
        """The served model's name, as clients send it as `model`."""
        self._clients: list[openai.OpenAI] = []
        self._last: ServerReport | None = None

    @property
    def api_url(self) -> str:
        """The OpenAI base URL: `base_url` + `/v1`."""
        return self.base_url + "/v1"

    # -- clients ------------------------------------------------------------------------------
    def client(self, *, max_retries: int = 0, **kwargs: Any) -> openai.OpenAI:
        """An `openai.OpenAI` for this server, closed when the server stops. `max_retries`
        defaults to 0 (a test of retries says how many); other arguments go to the client
        (`timeout`, `http_client`, ...)."""
        import openai

        kwargs.setdefault("api_key", "unused")
        client = openai.OpenAI(base_url=self.api_url, max_retries=max_retries, **kwargs)
        self._clients.append(client)
        return client

    def async_client(self, *, max_retries: int = 0, **kwargs: Any) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` for this server (asyncio or Trio). Close it in the test's
        own loop (`async with server.async_client() as client:`): the fixture cannot."""
        import openai

        kwargs.setdefault("api_key", "unused")
        return openai.AsyncOpenAI(base_url=self.api_url, max_retries=max_retries, **kwargs)

    # -- what the server saw ------------------------------------------------------------------
    def report(self) -> ServerReport:
        """What the server saw, read now on its Trio thread (after it stopped: its last)."""
        if self._runner.running:
            with suppress(trio.RunFinishedError):
                self._last = self._runner.call(partial(read_report, self._parts))
        if self._last is None:
            raise RuntimeError("the server stopped before its state was read")
        return self._last

    def requests(self, route: str | None = None, status: int | None = None) -> int:
        """Responses to `route` with `status` so far (None: any); see `ServerReport`."""
        return self.report().requests_to(route, status)

    def cancellations(self, cause: CancelCause | None = None) -> int:
        """Generations cancelled for `cause` so far (None: any)."""
        return self.report().cancelled(cause)

    def lanes_in_use(self) -> int:
        """Engine lanes held now: 0 when the client code under test has let go of its
        requests."""
        return self.report().lanes_in_use

    def steps_past_cancel(self) -> int:
        """Engine steps run past a cancel's step in flight, all cancels so far: 0 expected."""
        return self.report().steps_past_cancel

    def eventually(
        self, predicate: Callable[[ServerReport], bool], what: str = "", within: float = 5.0
    ) -> ServerReport:
        """Wait (polling, blocking the caller) until `predicate(report)` holds; returns that
        report. Raises AssertionError naming `what` after `within` seconds. For a change
        the server makes on its own thread after the client returns (a lane freed, a cancel
        counted). In an async test, `await eventually_async(...)` keeps the loop running."""
        deadline = time.monotonic() + within
        while True:
            report = self.report()
            if predicate(report):
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {within:g} s: {what or predicate}: {report}")
            time.sleep(0.005)  # polling another thread's state, bounded by the deadline

    async def eventually_async(
        self, predicate: Callable[[ServerReport], bool], what: str = "", within: float = 5.0
    ) -> ServerReport:
        """`eventually` for async tests (Trio or asyncio, through anyio): the test's own
        tasks (a stream being closed) run while it waits. Cancellable."""
        import anyio

        deadline = time.monotonic() + within
        while True:
            report = self.report()
            if predicate(report):
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {within:g} s: {what or predicate}: {report}")
            await anyio.sleep(0.005)

    def assert_no_leaks(self, within: float = 5.0) -> ServerReport:
        """Assert the server holds nothing for the code under test: no lane in use, nothing
        queued, no generation running, no engine step past a cancel's step in flight.

        Waits up to `within` seconds (polling) for the lanes to come back, as they do
        within an engine step of a client letting go; blocks the caller meanwhile."""
        try:
            report = self.eventually(lambda r: not r.leaks(), "no leaks", within)
        except AssertionError:
            report = self.report()
        assert not report.leaks(), "the server still holds: " + "; ".join(report.leaks())
        return report

    async def assert_no_leaks_async(self, within: float = 5.0) -> ServerReport:
        """`assert_no_leaks` for async tests: the test's own tasks run while it waits."""
        try:
            report = await self.eventually_async(lambda r: not r.leaks(), "no leaks", within)
        except AssertionError:
            report = self.report()
        assert not report.leaks(), "the server still holds: " + "; ".join(report.leaks())
        return report

    def _close(self) -> None:
        """Read the last state and close the clients; the server is about to stop."""
        with suppress(RuntimeError):
            self.report()
        for client in self._clients:
            client.close()
        self._clients.clear()


class _Runner:
    """The server's thread: `trio.run(serve)` until `stop`."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._started = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._shutdown: trio.Event | None = None
        self._running: Running | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main, name="mlx-nursery-test-server", daemon=True
        )
        """A daemon, as the engine's thread is: a server wedged past `stop`'s timeout must
        not keep the test process from exiting."""

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self, timeout: float) -> Running:
        """Start the thread; returns once the server listens with its model loaded. Raises
        RuntimeError when it failed to start or load (after joining the thread)."""
        self._thread.start()
        if not self._started.wait(timeout):
            self.stop(timeout)
            raise RuntimeError(f"the server did not start within {timeout:g} s")
        if self._failure is not None or self._running is None:
            self._thread.join()
            raise RuntimeError("the server failed to start") from self._failure
        if self._running.service.state == "failed":
            self._thread.join()
            raise RuntimeError("the server's model failed to load (its log says why)")
        return self._running

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's Trio thread and return what it returned, blocking.

        Not `trio.from_thread.run_sync`: that refuses a caller inside any Trio run, and a
        pytest-trio test is one. Raises trio.RunFinishedError once the server has ended."""
        assert self._token is not None
        answer: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

        def run() -> None:
            try:
                answer.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                answer.put((False, exc))

        self._token.run_sync_soon(run)
        try:
            ok, value = answer.get(timeout=_READ_TIMEOUT)
        except queue.Empty:
            raise RuntimeError(f"no answer from the server in {_READ_TIMEOUT:g} s") from None
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def stop(self, timeout: float) -> None:
        """Shut the server down as SIGTERM would (no grace unless its settings give one) and
        join its thread. Raises RuntimeError if it is still running after `timeout` s, or if
        it failed while it ran (so that a test sees its server crash)."""
        shutdown = self._shutdown
        if self._token is not None and shutdown is not None:
            with suppress(trio.RunFinishedError):
                self._token.run_sync_soon(shutdown.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the server did not stop within {timeout:g} s")
        if self._failure is not None:
            raise RuntimeError("the server failed while it ran") from self._failure

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # noqa: BLE001 - reported by start or stop
            self._failure = exc
        finally:
            self._started.set()
            from ..models import release_mlx_streams

            release_mlx_streams()  # this thread's, if it made any (ml-explore/mlx#4327)

    async def _serve(self) -> None:
        from ..server import serve
        from ._harness import harness

        self._shutdown = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        extensions = (harness(self._settings),)
        async with trio.open_nursery() as nursery:
            self._running = await nursery.start(
                partial(
                    serve,
                    self._settings,
                    extensions=extensions,
                    shutdown=self._shutdown,
                    handle_signals=False,
                )
            )
            self._started.set()


@contextmanager
def start_server(
    model: str = "scripted",
    *,
    start_timeout: float = 600.0,
    stop_timeout: float = 60.0,
    **settings: Any,
) -> Iterator[LiveServer]:
    """Serve `model` on 127.0.0.1 (a free port) on a thread of its own until the block ends.

    `model`: "scripted" (the default: no weights, starts in about half a second), a model
    directory, or `PATH=NAME`; `settings`: any of `mlx_nursery.settings.Settings` (e.g.
    `request_timeout=0.5`, `max_concurrency=1`, `script="defaults.json"`), over
    `DEFAULT_SETTINGS`.

    Blocks until the server listens with its model loaded (a real model: its load); raises
    RuntimeError if it failed. At the block's end (an exception included) it shuts down as
    SIGTERM would, cancelling what still runs, and joins the thread. Call it from sync code
    or from a thread; in an event loop it blocks that loop while it starts and stops.
    """
    from ..settings import Settings

    config = Settings(**{**DEFAULT_SETTINGS, "model": [model], **settings})
    runner = _Runner(config)
    running = runner.start(start_timeout)
    served = running.service.sources[0].name
    server = LiveServer(runner, running, served)
    try:
        yield server
    finally:
        server._close()
        runner.stop(stop_timeout)
