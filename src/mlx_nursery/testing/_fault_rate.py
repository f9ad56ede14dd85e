"""Server-wide fault injection (`--fault-rate`, `--fault`, `--fault-seed`): a fraction of the
generation requests, drawn from a seeded generator, get one chosen fault, with any model,
real ones included. For chaos tests of clients: what a client sees is what a failing server
would send, and the server's own guarantees hold (a faulted generation stops computing).

- `status:429|500|503`: the request is answered with that status before any work (429 and
  503 with Retry-After: 1).
- `error_after:N`: the generation fails after N outputs: a stream ends with an error event,
  a non-streaming request gets a 500.
- `drop_after:N`: a stream's connection is cut after N outputs (`_drops.py`); a
  non-streaming request gets the 500 of `error_after`.

An output is what the job passes on: a piece of text (about a token) or a tool call. The
harness (`_harness.py`) draws for each generation request as it arrives (the seam's
`on_request`, `serving/_extensions.py`) and counts each fault in the metrics.
"""

from __future__ import annotations

import random
import threading
from typing import Literal

import attrs

from ..generation import ConnectionDropped, FaultStatus, Finished, GenerationFailed, Output
from ..serving import Metrics, OutputHook
from ..settings import SettingsError

FaultKind = Literal["status", "error_after", "drop_after"]
STATUSES = (429, 500, 503)


@attrs.frozen
class Fault:
    kind: FaultKind
    value: int
    """The status, or the outputs before the failure."""


def parse_fault(text: str) -> Fault:
    """`status:503`, `error_after:5` or `drop_after:5`. Raises SettingsError."""
    kind, _, value = text.partition(":")
    if kind not in ("status", "error_after", "drop_after") or not value.isdigit():
        raise SettingsError(
            f"--fault {text!r}: expected status:429|500|503, error_after:N or drop_after:N"
        )
    number = int(value)
    if kind == "status" and number not in STATUSES:
        raise SettingsError(f"--fault {text!r}: the status is one of 429, 500, 503")
    if kind != "status" and number < 1:
        raise SettingsError(f"--fault {text!r}: N is at least 1")
    return Fault(kind, number)  # type: ignore[arg-type]  # checked just above


class FaultInjector:
    """Which requests get the fault: each draw is one request's, from one seeded generator
    (the same seed and the same order of requests give the same faulted requests)."""

    def __init__(self, rate: float, fault: Fault, seed: int | None) -> None:
        if not 0.0 <= rate <= 1.0:
            raise SettingsError(f"--fault-rate {rate} is not between 0 and 1")
        self.rate = rate
        self.fault = fault
        self._random = random.Random(seed)
        self._lock = threading.Lock()  # draws come from the Trio thread; cheap to be sure

    def draw(self) -> Fault | None:
        """This request's fault, or None. Not a checkpoint."""
        if self.rate <= 0.0:
            return None
        with self._lock:
            return self.fault if self._random.random() < self.rate else None

    def on_request(self, metrics: Metrics) -> OutputHook | None:
        """A generation request arrived: draw its fault. A status fault is raised here,
        before any work; the others return the hook that fails the job after N outputs."""
        fault = self.draw()
        if fault is None:
            return None
        metrics.faults_injected.labels(fault.kind).inc()
        if fault.kind == "status":
            raise injected_failure(fault.value)
        return _AfterOutputs(fault).observe


def injected_failure(status: int) -> FaultStatus:
    """A `status` fault's answer, sent before any work (429 and 503 with Retry-After: 1)."""
    return FaultStatus(
        status,
        f"injected fault: status {status} (--fault-rate)",
        code="injected_fault",
        retry_after=1.0 if status in (429, 503) else None,
    )


class InjectedBreak(GenerationFailed):
    """An `error_after` fault, raised in the job after its N outputs: the generation stops
    there (its compute with it) and the job ends with this failure."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(f"injected fault: {fault.kind}:{fault.value}", code="injected_fault")


class InjectedDrop(ConnectionDropped):
    """A `drop_after` fault, raised as `InjectedBreak` is: a stream's connection is cut there;
    a non-streaming request gets the 500 `InjectedBreak` would give."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(f"injected fault: {fault.kind}:{fault.value}", code="injected_fault")


@attrs.define
class _AfterOutputs:
    """One request's `error_after` or `drop_after`, counting its outputs."""

    fault: Fault
    outputs: int = 0

    def observe(self, output: Output) -> None:
        if isinstance(output, Finished):
            return
        self.outputs += 1
        if self.outputs == self.fault.value:  # raised out of the generation: its compute stops
            raise (InjectedDrop if self.fault.kind == "drop_after" else InjectedBreak)(self.fault)
