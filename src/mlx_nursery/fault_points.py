"""Named points of a request's life where a test can make the server's own code raise.

A failure inside the server (a detokenizer that meets a token with no text, a renderer
that meets an output it did not expect) must fail only the request it happened in. The
fault-injection tests prove that for every stage a request passes through: they arm a
point for one request id (`mlx_nursery.testing.injected_fault`), and the code at that point
raises `InjectedFault` when that request reaches it.

Unarmed (always, outside those tests) a point costs one truthiness check of a module
global: `reach` returns at once, and the engine's per-step sites test `ARMED` before
looking at their sequences.

Requests are told apart by their label: the HTTP request id, which the request's task
sets in `request_label` and every task and worker thread it starts inherits (Trio copies
the context into child tasks and into `to_thread` calls). The engine threads do not share
that context: an engine reads the label when a request is submitted and keeps it with the
request's sequence.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Literal, get_args

Point = Literal[
    "parse",
    "template",
    "tokenize",
    "admission",
    "prefix_fetch",
    "prefill",
    "decode_step",
    "sampler",
    "logits_processor",
    "detokenize",
    "reasoning_split",
    "tool_call_parse",
    "rendering",
    "sse_write",
    "store_write",
    "embedding_forward",
    "whisper_window",
    "synthesis_chunk",
    "speech_encoding",
    "engine_loop",
]
POINTS: tuple[Point, ...] = get_args(Point)

request_label: ContextVar[str | None] = ContextVar("mlx_nursery_request_label", default=None)
"""The label (HTTP request id) of the request the current task or thread works for."""

ARMED = False
"""Whether any point is armed (read without the lock: a stale read only delays a test's
fault by a step, and a test arms before it sends the request)."""

_armed: dict[Point, set[str]] = {}
_lock = threading.Lock()


class InjectedFault(Exception):
    """What an armed point raises: an unexpected failure of the server's own code."""

    def __init__(self, point: Point) -> None:
        super().__init__(f"injected fault at {point}")
        self.point = point


def reach(point: Point, label: str | None = None) -> None:
    """Raise `InjectedFault` if a test armed `point` for this request (`label`, else the
    current context's `request_label`). Any thread; not a checkpoint."""
    if not ARMED:
        return
    wanted = label if label is not None else request_label.get()
    with _lock:
        hit = wanted is not None and wanted in _armed.get(point, ())
    if hit:
        raise InjectedFault(point)


def arm(point: Point, label: str) -> None:
    """Make `point` raise for every request labelled `label` until `disarm`."""
    global ARMED
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}")
    with _lock:
        _armed.setdefault(point, set()).add(label)
        ARMED = True


def disarm(point: Point, label: str) -> None:
    global ARMED
    with _lock:
        labels = _armed.get(point, set())
        labels.discard(label)
        if not labels:
            _armed.pop(point, None)
        ARMED = bool(_armed)
