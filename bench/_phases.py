"""The engine thread's phases, timed by wrapping what runs them (`step_anatomy.py`'s probe):
exclusive time per phase, the primitives each phase evaluates, and, while `log` is set, each
change of the innermost phase with its time (`_timeline.py` lays the device's kernels
against it)."""

from __future__ import annotations

import functools
import re
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch, PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache

from mlx_nursery.engine import (
    _admission,
    _emitting,
    _ragged,
    _reuse,
    _runner,
    _schedule,
    _worker,
)
from mlx_nursery.engine._solo_sequence import SoloSequence


@dataclass(slots=True)
class _Frame:
    """A phase in progress on the stack."""

    label: str
    start: float
    nested: float = 0.0  # seconds of the phases nested in it


class Phases:
    """Exclusive time per phase on the engine thread (others are not timed)."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[_Frame] = []
        self.thread: int | None = None
        self.log: list[tuple[float, str]] | None = None
        """While set: (perf_counter, the innermost phase from then on) at each change."""

    def current(self) -> str:
        return self._stack[-1].label if self._stack else "rest"

    def _synchronize(self) -> None:
        mx.synchronize()

    def wrap(
        self, name: str, fn: Callable[..., Any], *, by_caller: bool = False
    ) -> Callable[..., Any]:
        """`fn` timed as phase `name`; `by_caller`: as `name (phase)`, for the phase that
        called it (MLX's launches and waits, split by what launched them)."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self.thread:
                return fn(*args, **kwargs)
            if self.sync and not self._stack:
                self._synchronize()
            label = f"{name} ({self.current()})" if by_caller else name
            frame = _Frame(label, time.perf_counter())
            self._stack.append(frame)
            log = self.log  # read once: the profiling task sets and clears it
            if log is not None:
                log.append((frame.start, label))
            try:
                return fn(*args, **kwargs)
            finally:
                if self.sync and len(self._stack) == 1:
                    self._synchronize()
                self._stack.pop()
                now = time.perf_counter()
                log = self.log
                if log is not None:
                    log.append((now, self.current()))
                elapsed = now - frame.start
                self.seconds[label] += elapsed - frame.nested
                self.calls[label] += 1
                if self._stack:
                    self._stack[-1].nested += elapsed

        return timed


class Graphs:
    """Primitives per evaluation, by the phase that asked for it (sampled: the first
    `limit` evaluations of each phase, since exporting a graph costs far more than running it
    on a small model)."""

    def __init__(self, phases: Phases, limit: int) -> None:
        self.phases = phases
        self.limit = limit
        self.by_phase: dict[str, list[Counter[str]]] = defaultdict(list)
        self._path = Path(tempfile.mkdtemp()) / "step.dot"

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def counted(*args: Any) -> Any:
            if threading.get_ident() == self.phases.thread:
                phase = self.phases.current()
                if len(self.by_phase[phase]) < self.limit:
                    arrays = [a for a in _flat(args) if isinstance(a, mx.array)]
                    mx.export_to_dot(str(self._path), *arrays)
                    labels = re.findall(r'label ="([^"]+)"', self._path.read_text())
                    if labels:  # an evaluation of what is already computed: nothing to count
                        self.by_phase[phase].append(Counter(labels))
            return fn(*args)

        return counted

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for phase, graphs in self.by_phase.items():
            total: Counter[str] = Counter()
            for graph in graphs:
                total.update(graph)
            n = len(graphs)
            if not n:  # its evaluations had nothing left to compute
                continue
            out[phase] = {
                "evaluations": n,
                "primitives_mean": round(sum(total.values()) / n, 1),
                "top": {k: round(v / n, 1) for k, v in total.most_common(25)},
            }
        return out


def _flat(values: Any) -> list[Any]:
    if isinstance(values, (list, tuple)):
        return [leaf for v in values for leaf in _flat(v)]
    if isinstance(values, dict):
        return [leaf for v in values.values() for leaf in _flat(v)]
    return [values]


def install(phases: Phases, *, launch: bool = False) -> None:
    targets: list[tuple[Any, str, str]] = [
        (GenerationBatch, "next", "decode"),
        (GenerationBatch, "__init__", "first"),
        (GenerationBatch, "extend", "join"),
        (GenerationBatch, "filter", "leave"),
        (GenerationBatch, "extract_cache", "extract"),
        (PromptProcessingBatch, "filter", "leave"),
        (PromptProcessingBatch, "split", "leave"),
        (BatchKVCache, "filter", "leave"),
        (_admission.Admission, "_admit", "admit"),
        (_admission.Admission, "make_room", "admit"),
        (_runner.Runner, "settle", "settle"),
        (_runner.Runner, "_detach", "detach"),
        (_reuse.PrefixReuse, "store", "store"),
        (_emitting.Emitter, "checked", "emit"),
        (_worker.Worker, "_take_commands", "commands"),
        (_ragged.RaggedBatchKVCache, "merge", "merge"),
        (_ragged.RaggedBatchKVCache, "extend", "join"),
        (SoloSequence, "_forward", "solo build"),
        (SoloSequence, "_take_in_flight", "solo read"),
        (SoloSequence, "_prefill_chunk", "chunk"),
    ]
    for owner, attr, name in targets:
        setattr(owner, attr, phases.wrap(name, getattr(owner, attr)))
    # The names `_schedule` calls them by (it imports them from `_chunk_forward`).
    for attr in ("launch_chunk", "prepare_chunk"):
        setattr(_schedule, attr, phases.wrap("chunk", getattr(_schedule, attr)))
    generator = _schedule.ServingBatchGenerator
    generator._finish_packed = phases.wrap("chunk", generator._finish_packed)  # type: ignore[method-assign]
    if launch:
        mx.async_eval = phases.wrap("launch", mx.async_eval, by_caller=True)
        mx.eval = phases.wrap("wait", mx.eval, by_caller=True)
