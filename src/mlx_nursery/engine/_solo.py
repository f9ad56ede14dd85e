"""The single-sequence fast path as a stepper (`_stepper.Stepper`): it holds at most one
`SoloSequence` (`_solo_sequence.py`, where the fast path and why it exists are described).

What it adds to the sequence: the lone row's LoRA adapter marked around each of its steps,
its speculator built from the engine's speculation settings and the costs every drafting
sequence here has measured, the prefill count the runner reads, and the handover's uid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ._adapters import RowAdapters
from ._drafting import Speculation, VerifyCosts
from ._kv_quant import CacheFactory
from ._sequence import LiveSequence, Response
from ._solo_sequence import Handover, SoloSequence
from ._speculating import speculator_factory
from ._stepper import KVState, Start
from ._upstream import make_prompt_cache


class SoloStepper:
    """The fast path as a stepper: it holds at most one sequence."""

    kind: Literal["solo", "batch"] = "solo"
    drafting: frozenset[int] = frozenset()  # no batch rows drafting here

    def __init__(
        self,
        model: Any,
        *,
        prefill_step_size: int,
        before_launch: Callable[[], None],
        make_cache: CacheFactory = make_prompt_cache,
        chunk_timed: Callable[[int, float], None] | None = None,
        speculation: Speculation | None = None,
        verified: Callable[[LiveSequence, int, int], None] | None = None,
        draft_model: Any = None,
        adapters: RowAdapters | None = None,
    ) -> None:
        self._model = model
        self._adapters = adapters or RowAdapters(None)
        """The rows' LoRA adapters (`_adapters.py`): the lone row's marks each step."""
        self._slot = 0
        self._speculation = speculation
        self._draft_model = draft_model
        """Drafts come from it where speculation's method is "draft" (`_draft_model`)."""
        self._verified = verified
        """Told each verify step's drafted and accepted tokens, with its sequence."""
        self.costs = VerifyCosts()
        """What steps cost here, learned by every sequence that drafts (`_drafting`)."""
        self._make_cache = make_cache
        self._chunk_timed = chunk_timed
        self._step_size = prefill_step_size
        self._before_launch = before_launch
        self._solo: SoloSequence | None = None
        self._prefilled = 0

    def insert(self, sequence: LiveSequence, start: Start) -> int:
        assert self._solo is None, "the fast path holds one sequence"
        slot = self._adapters.slot(sequence.request.adapter)
        self._solo = SoloSequence(
            self._model,
            -(sequence.seq_id + 1),  # negative: never a BatchGenerator uid
            start,
            sampler=sequence.sampler,
            processors=sequence.processors,
            stop_tokens=sequence.stop_ids,
            prefill_step_size=self._step_size,
            before_launch=self._before_launch,
            make_cache=self._make_cache,
            chunk_timed=self._chunk_timed,
            speculate=speculator_factory(
                self._speculation,
                self._model,
                sequence,
                self.costs,
                self._verified,
                self._draft_model,
            ),
        )
        self._slot = slot
        return self._solo.uid

    def step(self) -> list[Response]:
        if self._solo is None:
            return []
        before = self._solo.prefilled
        with self._adapters.use((self._slot,)):  # verify steps too; a draft model has none
            responses = self._solo.step()
        self._prefilled += self._solo.prefilled - before
        if responses and responses[-1].finish_reason is not None:
            self._solo = None
        return list(responses)

    def remove(self, uids: list[int], *, keep_state: bool) -> dict[int, KVState]:
        solo = self._solo
        if solo is None or solo.uid not in uids:
            return {}
        self._solo = None
        cache, tokens = solo.cancel()
        return {solo.uid: (cache, tokens)} if keep_state else {}

    def handover(self) -> tuple[int, Handover] | None:
        """Stop stepping the lone sequence here: its uid and where the batch continues it."""
        solo, self._solo = self._solo, None
        return None if solo is None else (solo.uid, solo.handover())

    def close(self) -> None:
        self._solo = None

    @property
    def uids(self) -> frozenset[int]:
        return frozenset() if self._solo is None else frozenset((self._solo.uid,))

    @property
    def prefilled(self) -> int:
        return self._prefilled

    @property
    def token_in_flight(self) -> bool:
        return self._solo is not None and self._solo.token_in_flight
