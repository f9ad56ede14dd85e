"""One model's device thread, seen from Trio: the lifecycle every engine shares.

Each engine (`Engine` for text, `Embedder`, `SpeechEngine`) runs its model on a thread of
its own that makes every MLX call on it (MLX streams are thread-affine). What differs is the
work on the thread; what is the same is written here once, and each engine holds a
`DeviceThread`:

- start: `run` starts the thread, which loads the model and reports ready (or the load's
  failure, which `run` raises); the engine is then "running" until `close()`, or until the
  thread ends on its own ("failed" if it died);
- lanes (`FairLanes`; tenant None where an engine has no tenants) and admission: the
  bounded queue in front of them, and a wait for a lane that `close()` or the thread's end
  cuts short with `EngineUnavailable` at once;
- posting: the thread reaches Trio only through `post` / `bind` (`run_sync_soon`), guarded
  so that a failing callback is logged instead of ending the Trio run. Everything the Trio
  side knows of the thread (state, results, counters) arrives this way; nothing is written
  across threads;
- the cancel acknowledgement: the shielded wait, bounded by `cancel_ack_timeout`, for the
  thread's confirmation that a request computes nothing more;
- teardown: stop, the thread's exit report, join, `ended`. On the thread,
  `run_device_thread` is the frame of its main (load, report ready, serve, finish, release
  the thread's MLX streams, report the exit).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Hashable
from contextlib import suppress
from typing import Generic, Literal, Protocol, TypeVar

import trio

from ._backend import bound_cuda_buffer_cache, keep_compiled_kernels
from ._errors import EngineOverloaded, EngineUnavailable
from ._lanes import FairLanes
from ._priority import PriorityPolicy

log = logging.getLogger("mlx_nursery.engine")

State = Literal["starting", "running", "stopping", "closed", "failed"]
InfoT = TypeVar("InfoT")
ModelT = TypeVar("ModelT")


class ThreadBody(Protocol):
    """The work of an engine's thread: `run` is the thread's main, `stop` (any thread) asks
    it to end. `run` reports through `DeviceThread.report_ready` once, then
    `report_exit` once, last."""

    def run(self) -> None: ...

    def stop(self) -> None: ...


class DeviceThread(Generic[InfoT]):
    """The Trio side of one engine thread; `InfoT` is what the loaded model tells Trio."""

    def __init__(
        self,
        thread_name: str,
        *,
        lanes: int,
        max_queue: int,
        cancel_ack_timeout: float,
        tenant_share: int | None = None,
        priorities: PriorityPolicy | None = None,
        what: str = "engine",
    ) -> None:
        self.thread_name = thread_name
        self.what = what
        """The engine, as errors and the log name it."""
        self.state: State = "starting"
        self.lanes = FairLanes(lanes, priorities)
        self.max_queue = max_queue
        self.tenant_share = tenant_share
        """Of the queue, the most one tenant may hold (None: no tenants)."""
        self.cancel_ack_timeout = cancel_ack_timeout
        self.info: InfoT | None = None
        self.ended = trio.Event()
        """Set once `run` is over: the thread has exited (closed, or dead) and been joined."""
        self._waiting: set[trio.CancelScope] = set()
        self._body: ThreadBody | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._load_failure: BaseException | None = None
        self._ready = trio.Event()
        self._exited = trio.Event()
        self._on_exit: Callable[[BaseException | None], None] = lambda exc: None

    # -- lifecycle (Trio thread) ------------------------------------------------------------
    async def run(
        self,
        body: ThreadBody,
        *,
        started: Callable[[], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        """Start the thread on `body`, wait for its load, call `started()` (where the engine
        calls its `task_status.started`), and serve until the thread exits.

        Raises what the load raised. `on_exit(exc)` runs on the Trio thread when the thread
        reports its exit (after the state is final and lane waiters are woken): for the
        requests it left behind. Returns only once the thread has been joined; cancelled,
        it stops the thread first (shielded: the thread ends its step, then exits)."""
        self._trio_token()
        self._body, self._on_exit = body, on_exit
        thread = threading.Thread(target=body.run, name=self.thread_name, daemon=True)
        thread.start()
        try:
            await self._ready.wait()
            if self._load_failure is not None:
                raise self._load_failure
            if self.state == "starting":
                self.state = "running"
            else:  # closed while loading
                body.stop()
            started()
            await self._exited.wait()
        finally:
            with trio.CancelScope(shield=True):
                body.stop()
                await self._exited.wait()
            thread.join()
            self.ended.set()

    def close(self) -> None:
        """Refuse new work and ask the thread to end; lane waiters get EngineUnavailable at
        once. Not a checkpoint."""
        if self.state in ("starting", "running"):
            self.state = "stopping"
            if self._body is not None:
                self._body.stop()
            self._wake_waiters()

    def ending(self, state: Literal["closed", "failed"]) -> None:
        """The thread says it is ending (before it releases its last lanes): a waiter that
        a freed lane wakes must see the engine is gone."""
        self.state = state
        self._wake_waiters()

    @property
    def healthy(self) -> bool:
        return self.state == "running"

    def loaded(self) -> InfoT:
        """What the loaded model tells Trio; EngineUnavailable before it has loaded."""
        if self.info is None:
            raise EngineUnavailable(f"the {self.what} has not loaded its model")
        return self.info

    # -- admission and lanes (Trio thread) ---------------------------------------------------
    def check_running(self) -> None:
        if self.state != "running":
            raise EngineUnavailable(f"the {self.what} is {self.state}")

    def check_queue(self, tenant: Hashable = None) -> None:
        """EngineOverloaded when no lane is free and the queue (or `tenant`'s share of it) is
        full: refused at once, never queued without bound."""
        lanes = self.lanes
        if lanes.available_tokens > 0:
            return
        waiting = lanes.statistics().tasks_waiting
        if waiting >= self.max_queue:
            raise EngineOverloaded(waiting, self.max_queue)
        share = self.tenant_share
        if tenant is not None and share is not None and lanes.waiting_for(tenant) >= share:
            raise EngineOverloaded(lanes.waiting_for(tenant), share)  # room left for others

    async def acquire_lane(
        self, borrower: object, tenant: Hashable = None, priority: int = 0
    ) -> None:
        """Borrow a lane for `borrower` (by priority; FIFO within a tenant, fair across
        tenants).

        Raises EngineUnavailable when the engine stops first (at once: `close()` and the
        thread's end wake every waiter) or has stopped when the lane comes. Cancellation: a
        checkpoint; cancelled while waiting, nothing is borrowed."""
        with trio.CancelScope() as waiting:
            self._waiting.add(waiting)
            try:
                await self.lanes.acquire_on_behalf_of(borrower, tenant, priority)
            finally:
                self._waiting.discard(waiting)
        if waiting.cancelled_caught or self.state != "running":
            if not waiting.cancelled_caught:
                self.lanes.release_on_behalf_of(borrower)
            raise EngineUnavailable(f"the {self.what} is {self.state}")

    def release_lane(self, borrower: object) -> None:
        """Only on the thread's confirmation that `borrower` computes nothing more: its lane,
        or its place in line if it waits for one after a preemption (`FairLanes.withdraw`)."""
        self.lanes.withdraw(borrower)

    async def wait_confirmed(self, confirmed: trio.Event, request: str) -> bool:
        """After a cancel: wait, shielded and bounded by `cancel_ack_timeout`, for the
        thread's confirmation; whether it came (an error is logged if not). Not cancellable
        (it is the cancelled caller's exit path), and it never waits longer than the bound."""
        with trio.move_on_after(self.cancel_ack_timeout, shield=True):
            await confirmed.wait()
        if not confirmed.is_set():
            log.error("%s not confirmed stopped in time", request)
        return confirmed.is_set()

    def _wake_waiters(self) -> None:
        for scope in self._waiting:
            scope.cancel()

    # -- posting to Trio -----------------------------------------------------------------------
    def bind(self, fn: Callable[..., None]) -> Callable[..., None]:
        """`fn` as the thread calls it to run it on the Trio thread (guarded). Bind once,
        on the Trio thread (a hot path posts once per token on the thread that a lone
        stream is bound by: no lookup or wrapper per post)."""
        return functools.partial(_call_soon, self._trio_token(), self._guarded(fn))

    def post(self, fn: Callable[..., None], *args: object) -> None:
        """Any thread, once `run` has begun: run `fn(*args)` on the Trio thread soon."""
        assert self._token is not None, "post before run"
        _call_soon(self._token, self._guarded(fn), *args)

    def report_ready(self, info: InfoT | None, exc: BaseException | None) -> None:
        """The thread: the model is loaded (`info`), or its load failed (`exc`)."""

        def apply() -> None:
            self.info, self._load_failure = info, exc
            self._ready.set()

        self.post(apply)

    def report_exit(self, exc: BaseException | None) -> None:
        """The thread, last: it is ending (`exc`: it died of it)."""

        def apply() -> None:
            self.state = "failed" if exc is not None else "closed"
            self._wake_waiters()
            self._on_exit(exc)
            self._exited.set()

        self.post(apply)

    def _trio_token(self) -> trio.lowlevel.TrioToken:
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        return self._token

    def _guarded(self, fn: Callable[..., None]) -> Callable[..., None]:
        """`fn` for `run_sync_soon`: an exception there would end the Trio run."""
        what = self.what

        def guarded(*args: object) -> None:
            try:
                fn(*args)
            except Exception:  # a failed delivery must not end the Trio run
                log.exception("%s delivery failed", what)

        return guarded


def _call_soon(token: trio.lowlevel.TrioToken, fn: Callable[..., None], *args: object) -> None:
    with suppress(trio.RunFinishedError):
        token.run_sync_soon(fn, *args)


# -- the thread's side ------------------------------------------------------------------------
def run_device_thread(
    what: str,
    load: Callable[[], tuple[InfoT, ModelT]],
    serve: Callable[[ModelT], None],
    finish: Callable[[BaseException | None], None],
    on_ready: Callable[[InfoT | None, BaseException | None], None],
    on_exit: Callable[[BaseException | None], None],
) -> None:
    """The frame of an engine thread's main: load the model and report ready (`on_ready`;
    or the load's failure), `serve` until stopped, `finish(exc)` (end whatever is left:
    nobody waits forever), drop the model, release this thread's MLX streams, and report
    the exit (`on_exit`, last). The reports are `DeviceThread.report_ready` / `report_exit`.

    A `serve` that raises is the engine's death (`exc`), logged here; the Trio side then
    reports the engine failed instead of raising into its nursery."""
    reason: BaseException | None = None
    keep_compiled_kernels()
    bound_cuda_buffer_cache()
    try:
        try:
            info, model = load()
        except BaseException as exc:  # noqa: BLE001 - reported to the Trio side, which raises it
            reason = exc
            on_ready(None, exc)
            return
        on_ready(info, None)
        try:
            serve(model)
        except BaseException as exc:  # a dead loop must still release everyone
            log.exception("%s loop failed; it is stopping", what)
            reason = exc
        finally:
            finish(reason)
            del model
    finally:
        release_streams()
        on_exit(reason)


def release_streams() -> None:
    """On an engine thread, last: land its work in flight and destroy its MLX streams.

    MLX requires every thread that made streams to destroy them before it ends; otherwise
    the process can abort at exit (ml-explore/mlx#4327). This thread makes no MLX call
    afterwards. A failure here is logged, not raised: the thread must still report its exit."""
    import mlx.core as mx

    try:
        mx.synchronize()
        mx.clear_cache()
        mx.clear_streams()
    except Exception:
        log.exception("releasing an engine thread's MLX streams failed")
