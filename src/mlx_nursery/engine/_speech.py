"""The speech runtime: a Whisper on a thread of its own, one transcription at a time.

Whisper is not a text-generation model (an encoder per 30-second window, a short decode per
window), so it does not go through the text engine's batch. It keeps that engine's rules:

- One thread (`mlx-nursery-speech`), started and joined by `SpeechEngine.run`, makes every
  MLX call on the model: load, spectrogram, encoder, decoder. Transcriptions never overlap.
- One lane (a `trio.CapacityLimiter(1)`, FIFO and cancellable), borrowed before a
  transcription is handed to the thread and returned by the thread's confirmation that it
  ended, never by the caller: `lanes_borrowed` is what may still compute. In front of it a
  bounded queue (`max_queue`): past it, `EngineOverloaded` at once.
- Cancellation is cooperative: leaving `transcribe`'s block sets the transcription's stop
  flag; the thread checks it before every window and every decoder step (`_whisper.py`),
  so the compute stops within one token, and confirms. The caller waits for the
  confirmation shielded, bounded by `cancel_ack_timeout`.
- Results cross to Trio once per window (`run_sync_soon`) into a bounded channel; a
  consumer that stops reading is stopped rather than buffered without bound.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from .. import fault_points
from ..fault_points import request_label
from ._errors import EngineOverloaded, EngineUnavailable
from ._speech_types import (
    SpeechModelInfo,
    SpeechStatistics,
    Transcript,
    TranscriptionRequest,
    Window,
)

log = logging.getLogger("mlx_nursery.engine")

SPEECH_THREAD_NAME = "mlx-nursery-speech"

SpeechEvent = Window | Transcript | EngineUnavailable
"""What a transcription's channel carries: windows, then a transcript or an error."""

_State = Literal["starting", "running", "stopping", "closed", "failed"]


@attrs.frozen
class SpeechConfig:
    model: Path
    max_queue: int = 64
    """Transcriptions that may wait for the lane; past it, `EngineOverloaded`."""
    cancel_ack_timeout: float = 30.0
    max_buffered_windows: int = 64


@attrs.define(eq=False)
class _Job:
    request: TranscriptionRequest
    send: trio.MemorySendChannel[SpeechEvent]
    stop: threading.Event = attrs.Factory(threading.Event)
    confirmed: trio.Event = attrs.Factory(trio.Event)
    label: str | None = attrs.Factory(request_label.get)
    """The request's label (its HTTP request id), for the fault seam (`fault_points`)."""


class SpeechEngine:
    """A Whisper served from its own thread. Start it with `nursery.start(engine.run)`."""

    def __init__(self, config: SpeechConfig) -> None:
        self.config = config
        self._state: _State = "starting"
        self._lane = trio.CapacityLimiter(1)
        self._commands: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._info: SpeechModelInfo | None = None
        self._running = False
        self._windows = 0
        self._tokens = 0
        self._cancelled = 0
        self.ended = trio.Event()
        """Set once `run` is over: the thread has exited (closed, or dead) and been joined."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(
        self, *, task_status: trio.TaskStatus[SpeechEngine] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the speech thread, load the model on it, serve until `close()`.

        Raises what the load raised. Returns only once the thread has ended and been
        joined; cancelled, it stops the thread first (shielded: within one token)."""
        token = trio.lowlevel.current_trio_token()
        loaded, exited = trio.Event(), trio.Event()
        failure: list[BaseException] = []

        def post(fn: Callable[..., None], *args: object) -> None:
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(_guarded(fn), *args)

        def on_loaded(info: SpeechModelInfo | None, exc: BaseException | None) -> None:
            self._info = info
            if exc is not None:
                failure.append(exc)
            loaded.set()

        thread = threading.Thread(
            target=self._thread_main,
            args=(post, on_loaded, exited.set),
            name=SPEECH_THREAD_NAME,
            daemon=True,
        )
        thread.start()
        try:
            await loaded.wait()
            if failure:
                raise failure[0]
            if self._state == "starting":
                self._state = "running"
            task_status.started(self)
            await exited.wait()
        finally:
            with trio.CancelScope(shield=True):
                self._commands.put(None)
                await exited.wait()
            thread.join()
            if self._state != "failed":
                self._state = "closed"
            self.ended.set()

    def close(self) -> None:
        """Refuse new work; the thread finishes (or stops) its transcription and exits."""
        if self._state in ("starting", "running"):
            self._state = "stopping"
            self._commands.put(None)

    # -- public surface ----------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self._state == "running"

    @property
    def info(self) -> SpeechModelInfo:
        if self._info is None:
            raise EngineUnavailable("the speech engine has not loaded its model")
        return self._info

    @property
    def limiter(self) -> trio.CapacityLimiter:
        return self._lane

    def statistics(self) -> SpeechStatistics:
        return SpeechStatistics(
            state=self._state,
            lanes_borrowed=self._lane.borrowed_tokens,
            queued=self._lane.statistics().tasks_waiting,
            running=self._running,
            windows_decoded=self._windows,
            tokens_decoded=self._tokens,
            cancelled=self._cancelled,
        )

    @asynccontextmanager
    async def transcribe(
        self, request: TranscriptionRequest
    ) -> AsyncIterator[trio.MemoryReceiveChannel[SpeechEvent]]:
        """Transcribe `request`; the block reads its events: a `Window` per 30-second window
        decoded, then the `Transcript` (or an `EngineUnavailable` when it failed).

        Raises `EngineOverloaded` when `max_queue` transcriptions already wait,
        `EngineUnavailable` when the engine is not running.

        Cancellation: waiting for the lane is cancellable at no cost. Leaving the block
        early (a cancelled scope, a `break`) stops the transcription within one decoder
        step: the block's exit waits, shielded and bounded by `cancel_ack_timeout`, for the
        thread's confirmation, and the lane returns with that confirmation only."""
        if self._state != "running":
            raise EngineUnavailable("the speech engine is not running")
        waiting = self._lane.statistics().tasks_waiting
        if waiting >= self.config.max_queue:
            raise EngineOverloaded(waiting, self.config.max_queue)
        send, receive = trio.open_memory_channel[SpeechEvent](self.config.max_buffered_windows)
        job = _Job(request, send)
        await self._lane.acquire_on_behalf_of(job)
        if self._state != "running":  # closed while this one waited
            self._lane.release_on_behalf_of(job)
            raise EngineUnavailable("the speech engine is not running")
        self._commands.put(job)
        try:
            async with receive:
                yield receive
        finally:
            job.stop.set()
            with trio.CancelScope(shield=True), trio.move_on_after(self.config.cancel_ack_timeout):
                await job.confirmed.wait()

    # -- the thread --------------------------------------------------------------------------
    def _thread_main(
        self,
        post: Callable[..., None],
        on_loaded: Callable[[SpeechModelInfo | None, BaseException | None], None],
        on_exit: Callable[[], None],
    ) -> None:
        import mlx.core as mx

        try:
            try:
                from ..models import load_speech_model

                model = load_speech_model(self.config.model)
                from . import _whisper  # mlx-audio's Whisper: imported here, off the server's start
            except BaseException as exc:  # noqa: BLE001 - the load's failure goes to `run`
                self._state = "failed"
                post(on_loaded, None, exc)
                return
            info = SpeechModelInfo(
                str(model.path), model.multilingual, model.word_timestamps, _whisper.LANGUAGES
            )
            post(on_loaded, info, None)
            while (job := self._commands.get()) is not None:
                self._serve(job, model.model, _whisper, post)
            del model
        finally:
            with suppress(queue.Empty):
                while True:  # queued behind the stop: confirmed, never run
                    if (left := self._commands.get_nowait()) is not None:
                        post(self._confirm, left, EngineUnavailable("the speech engine stopped"))
            with suppress(Exception):
                mx.synchronize()
                mx.clear_cache()
                mx.clear_streams()  # every thread that made streams must (ml-explore/mlx#4327)
            post(on_exit)

    def _serve(self, job: _Job, model: Any, whisper: Any, post: Callable[..., None]) -> None:
        """Run one transcription; its events and its confirmation go to Trio."""

        def check() -> None:
            if job.stop.is_set():
                raise whisper.Stopped
            if fault_points.ARMED:
                fault_points.reach("whisper_window", job.label)

        def on_token() -> None:
            self._tokens += 1

        def emit(window: Window) -> None:
            self._windows += 1
            post(self._deliver, job, window)

        outcome: SpeechEvent | None = None
        self._running = True
        try:
            outcome = whisper.transcribe(model, job.request, check, emit, on_token)
        except whisper.Stopped:
            self._cancelled += 1
        except Exception:
            log.exception("a transcription failed")
            outcome = EngineUnavailable("the transcription failed; the server's log says why")
        finally:
            self._running = False
            post(self._confirm, job, outcome)

    # -- the Trio side of the thread's posts ---------------------------------------------------
    def _deliver(self, job: _Job, event: SpeechEvent) -> None:
        try:
            job.send.send_nowait(event)
        except trio.WouldBlock:
            job.stop.set()  # the consumer stopped reading: stop rather than buffer
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the consumer is gone; its confirmation still arrives

    def _confirm(self, job: _Job, outcome: SpeechEvent | None) -> None:
        if outcome is not None:
            self._deliver(job, outcome)
        job.send.close()
        self._lane.release_on_behalf_of(job)
        job.confirmed.set()


def _guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """`fn` for `run_sync_soon`: an exception there would end the Trio run."""

    def guarded(*args: object) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("speech engine delivery failed")

    return guarded
