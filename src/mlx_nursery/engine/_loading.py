"""Sequences whose cached prefix is read from disk (the ledger's LOADING state): admitted,
held by no stepper while the disk tier's reader thread reads and checks the file, then
started as a prefix-cache hit starts (`Placement.start`), once their prefix is in MLX
arrays; a few megabytes of it per iteration while others decode (`_disk_kv.Restoring`).

A read that serves nothing (the file went, or was refused) starts the sequence afresh, as a
memory-tier miss would have: its prompt prefilled, or its images' prefill begun. A cancel
while loading ends the sequence at once (`Runner.cancel`); its read, if not started, is
skipped, and its result, if any, dropped. Engine thread only.
"""

from __future__ import annotations

import logging

import attrs

from ._disk_entries import DiskRead
from ._disk_kv import RESTORE_BYTES_PER_ITERATION, Restoring
from ._imaging import Imaging
from ._ledger import Ledger
from ._messages import StepEvent
from ._outbox import Outbox
from ._placement import Placement
from ._reuse import PrefixReuse
from ._sequence import COULD_NOT_START, LiveSequence
from ._stepper import Start

log = logging.getLogger("mlx_nursery.engine")


@attrs.define(eq=False)
class PrefixLoad:
    """A LOADING sequence's read (`LiveSequence.loading`) and, once read, its restoring."""

    read: DiskRead
    prompt: list[int]
    restoring: Restoring | None = None

    @property
    def ready(self) -> bool:
        """The read is over: there is work for the engine thread (the loop must not block)."""
        return self.read.done.is_set()

    def cancel(self) -> None:
        self.read.cancelled = True


class Loading:
    """Starts the LOADING sequences as their reads end (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        placement: Placement,
        reuse: PrefixReuse,
        imaging: Imaging,
        outbox: Outbox,
    ) -> None:
        self._ledger = ledger
        self._placement = placement
        self._reuse = reuse
        self._imaging = imaging
        self._outbox = outbox

    def begin(self, sequence: LiveSequence, prompt: list[int], read: DiskRead) -> None:
        sequence.loading = PrefixLoad(read, prompt)
        self._ledger.begin_loading(sequence)

    def advance(self) -> None:
        """Start the sequences whose reads are over, oldest first, their prefixes copied
        into MLX within this iteration's budget (all of it while nothing decodes)."""
        budget = RESTORE_BYTES_PER_ITERATION if self._ledger.stepping() else None
        for sequence in self._ledger.loading():
            load: PrefixLoad = sequence.loading
            if not load.ready:
                continue
            if load.read.kv is not None and budget is not None and budget <= 0:
                return
            try:
                spent = self._advance(sequence, load, budget)
            except Exception:  # fails this request only
                log.exception("could not start sequence %d", sequence.seq_id)
                self._ledger.finish(sequence, sequence.final("error", COULD_NOT_START))
                continue
            budget = None if budget is None else budget - spent

    def _advance(self, sequence: LiveSequence, load: PrefixLoad, budget: int | None) -> int:
        """Copy more of the prefix read, and start the sequence once all of it is in MLX
        (or afresh, if the read served nothing or the copy failed). Returns bytes copied."""
        kv = load.read.kv
        if kv is None:
            self._start_afresh(sequence, load.prompt)
            return 0
        try:
            if load.restoring is None:
                load.restoring = self._reuse.restorer(kv)
            spent = load.restoring.advance(budget)
        except Exception:  # out of memory, say: logged, and prefilled afresh
            log.exception("could not copy sequence %d's prefix from disk", sequence.seq_id)
            self._reuse.record_failure()
            self._start_afresh(sequence, load.prompt)
            return 0
        if load.restoring.done:
            self._start_cached(sequence, load)
        return spent

    def _start_cached(self, sequence: LiveSequence, load: PrefixLoad) -> None:
        kv, prompt = load.restoring, load.prompt
        assert kv is not None
        cached = kv.tokens
        start = Start(prompt[cached:], kv.cache, prompt[:cached], sequence.request.max_tokens)
        try:
            self._placement.start(sequence, start)
        except Exception:  # noqa: BLE001 - a state that will not merge: prefill afresh
            self._reuse.record_failure()
            self._start_afresh(sequence, prompt)
            return
        sequence.cached_tokens = cached
        self._reuse.disk_hit(load.read, kv)
        self._report(sequence)

    def _start_afresh(self, sequence: LiveSequence, prompt: list[int]) -> None:
        images = sequence.request.images
        if images is not None:
            self._imaging.begin(sequence, prompt, images)
        else:
            self._placement.start(sequence, Start(prompt, None, [], sequence.request.max_tokens))
        self._report(sequence)

    def _report(self, sequence: LiveSequence) -> None:
        """The admission event of a request that asks for it (as `Admission` reports it)."""
        if sequence.request.report_admission:
            self._outbox.token(sequence.seq_id, StepEvent(None, usage=sequence.usage()))
