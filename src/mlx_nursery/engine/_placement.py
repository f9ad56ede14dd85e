"""Which stepper holds the active sequences, and moving them between the two.

One stepper holds the active sequences at a time: the fast path's (`SoloStepper`) while a
lone sequence runs, else the batch's (`BatchStepper`, or the scripted model's only
stepper). When company arrives the lone sequence is handed over to the batch with its KV
cache and its token in flight; after a failed step the batch is replaced. Engine thread
only.
"""

from __future__ import annotations

import logging

from ..models import LoadedModel
from ._adapters import RowAdapters
from ._chunking import ChunkSizer, budget_ms
from ._config import EngineConfig
from ._counters import RunCounters
from ._emitting import Emitter
from ._kv_quant import cache_factory
from ._ledger import Ledger
from ._outbox import Outbox
from ._scripted import ScriptedStepper
from ._sequence import COULD_NOT_CONTINUE, LiveSequence, Response
from ._shapes import ShapeWatch
from ._solo import SoloStepper
from ._stepper import BatchStepper, Start, Stepper

log = logging.getLogger("mlx_nursery.engine")


class Placement:
    """The two steppers of one loaded model, and which one is in use (`current`)."""

    def __init__(
        self,
        config: EngineConfig,
        model: LoadedModel,
        ledger: Ledger,
        outbox: Outbox,
        emitter: Emitter,
        counters: RunCounters,
    ) -> None:
        self._config = config
        self._model = model
        self._ledger = ledger
        self._emitter = emitter
        self._counters = counters
        self._scripted = model.kind == "scripted"
        """The scripted model: its stepper is the only one (no fast path, no handover)."""
        self.fast_path = config.single_sequence_fast_path and not self._scripted
        self.adapters = RowAdapters(model.adapters) if model.adapters is not None else None
        """The rows' LoRA adapters, where the model serves any (`_adapters.py`)."""
        self.shapes = ShapeWatch(model.model)
        """The model as both steppers call it, counting the prefill shapes they run."""
        self.make_cache = cache_factory(config.kv_quantization)
        """Fresh KV caches, quantized if the config asks (engine/_kv_quant.py)."""
        self.chunks = ChunkSizer(config.chunk_tokens(), budget_ms(config.prefill_chunk_ms))
        """Sizes the prefill chunks run beside decoding sequences (engine/_chunking.py)."""
        self.batch: Stepper = self._new_batch()
        self.solo = SoloStepper(
            self.shapes,
            prefill_step_size=config.chunk_tokens(),
            before_launch=outbox.post_at_launch,
            make_cache=self.make_cache,
            chunk_timed=self.chunks.observe,
            speculation=config.speculation,
            draft_model=model.draft,
            # The counters' method, not one of this object's: the fast path it is handed to
            # is this object's, and a cycle through it would keep the model's weights alive
            # past an unload until the garbage collector ran.
            verified=self._counters.verified,
            adapters=self.adapters,
        )
        self.current: Stepper = self.batch
        self.previous_responses: list[Response] = []
        """The last step's responses (MLX arrays), released only once the next step has run,
        as a `generate_step` loop releases them: releasing them while the next step is in
        flight cost a lone stream markedly on CUDA (docs/architecture.md)."""

    @property
    def unused(self) -> Stepper:
        return self.batch if self.current is self.solo else self.solo

    @property
    def prefilled(self) -> int:
        return self._counters.retired_prefill + self.batch.prefilled + self.solo.prefilled

    def for_newcomer(self) -> Stepper:
        """The stepper a sequence starting now goes into: the fast path if it will be alone,
        else the batch (the fast path's sequence, if any, handed over first)."""
        if self.fast_path and not self._ledger.in_company():
            return self.solo
        self.hand_over()
        return self.batch

    def start(self, sequence: LiveSequence, start: Start) -> None:
        """Put a sequence whose prompt is prefilled into a stepper (raises if it cannot)."""
        self.insert(self.for_newcomer(), sequence, start)

    def insert(self, stepper: Stepper, sequence: LiveSequence, start: Start) -> None:
        """Insert `sequence` into `stepper`, which becomes the one in use (raises if it
        cannot: nothing changes)."""
        self.placed(stepper, sequence, stepper.insert(sequence, start))

    def placed(self, stepper: Stepper, sequence: LiveSequence, uid: int) -> None:
        """`stepper` took `sequence` under `uid`: it is the stepper in use."""
        self.current = stepper
        self._ledger.activate(sequence, uid)

    def hand_over(self) -> None:
        """Swap the fast path for the batch; its lone sequence moves along, KV cache and
        in-flight token included. A failure here fails that sequence alone."""
        self.current = self.batch
        if not self.solo.uids:
            return
        (uid,) = self.solo.uids
        sequence = self._ledger.by_uid(uid)
        assert sequence is not None
        self._counters.handovers += 1
        try:
            taken = self.solo.handover()
            assert taken is not None
            handover = taken[1]
            if handover.response is not None:
                self._emitter.token(sequence, handover.response)
                if handover.response.finish_reason is not None:
                    return  # it ended on the token that was in flight
            self.insert(self.batch, sequence, handover.start)
        except Exception:  # fails this request only, as a failed admission does
            log.exception("could not move sequence %d into the batch", sequence.seq_id)
            self._ledger.finish(sequence, sequence.final("error", COULD_NOT_CONTINUE))

    def replace_batch(self) -> None:
        """After a failed step: a fresh batch in use, the fast path emptied. The sequences
        they held are the caller's to place again."""
        self.previous_responses = []
        self.retire_batch()
        self.batch = self._new_batch()
        self.solo.close()
        self.current = self.batch

    def retire_batch(self) -> None:
        """Close the batch stepper; sequences still to detach from it go with it."""
        self._ledger.drop_detaching(self.batch)
        self._counters.retired_prefill += self.batch.prefilled
        self.batch.close()

    def close(self) -> None:
        self.retire_batch()
        self.solo.close()
        self.previous_responses = []

    def _new_batch(self) -> Stepper:
        if self._scripted:
            config = self._model.config
            return ScriptedStepper(int(config["vocab_size"]), int(config["eos_token_id"][0]))
        make_cache = self.make_cache if self._config.kv_bits is not None else None
        if self._config.distribution is not None:
            return self._config.distribution.batch_stepper(self.shapes, self._config, make_cache)
        return BatchStepper(
            self.shapes,
            max_concurrency=self._config.max_concurrency,
            prefill_batch_size=self._config.prefill_batch_size,
            prefill_step_size=self._config.chunk_tokens(),
            chunk_sizer=self.chunks,
            make_cache=make_cache,
            adapters=self.adapters,
            speculation=self._config.speculation,
            verified=self._counters.verified,  # not a method of this object: as the solo's
            draft_model=self._model.draft,
            pack_chunks=self._config.packs_chunks,
        )
