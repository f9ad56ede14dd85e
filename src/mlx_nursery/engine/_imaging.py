"""Image prompts on the engine thread: their prefill, a chunk per iteration, then their
start in a stepper (as a prefix-cache hit starts). The vision side is `_vision.py`."""

from __future__ import annotations

import logging
import time

from ..models import LoadedModel
from ._ledger import Ledger
from ._placement import Placement
from ._sequence import COULD_NOT_START, LiveSequence
from ._stepper import Start
from ._types import ImageInputs
from ._vision import ImagePrefill

log = logging.getLogger("mlx_nursery.engine")


class Imaging:
    """The image prompts being prefilled (the ledger's IMAGING sequences)."""

    def __init__(self, model: LoadedModel, ledger: Ledger, placement: Placement) -> None:
        self._model = model
        self._ledger = ledger
        self._placement = placement

    def begin(self, sequence: LiveSequence, prompt: list[int], images: ImageInputs) -> None:
        """Encode the images (raises what the model raises) and queue the prompt's prefill,
        a chunk per iteration (`prefill`); the sequence starts once it is done."""
        sequence.prefill = ImagePrefill(self._model, prompt, images, self._placement.make_cache)
        self._ledger.begin_imaging(sequence)

    def prefill(self) -> None:
        """Chunks of the image prompts' prefills, oldest first, up to a text chunk's size in
        all (at least one chunk), as a text prefill chunk bounds an iteration: the sizer's
        (`prefill_step_size` unless sequences decode beside them and it shrinks it)."""
        chunks = self._placement.chunks
        size = chunks.size(1, decoding=self._ledger.stepping())
        budget = size
        for sequence in self._ledger.imaging():
            if budget <= 0:
                return
            budget -= self._chunk(sequence, size)

    def _chunk(self, sequence: LiveSequence, size: int) -> int:
        """One chunk (up to `size` tokens) of this image prompt's prefill; once it is done,
        the sequence starts as a prefix-cache hit would (the fast path if alone, else the
        batch). A failure fails that request alone. Returns the tokens prefilled.

        Beside decoding sequences the chunk is launched, not waited for (as a text chunk is,
        `_schedule.py`): a host wait here would leave the device idle until the decode step
        after it is launched. Alone it is waited for, and timed for the chunk sizer."""
        prefill: ImagePrefill = sequence.prefill
        tokens = 0
        beside = self._ledger.stepping()
        try:
            if not beside:
                prefill.wait_encoded()  # the encoding's time is not the chunk's
            started = time.perf_counter()
            tokens = prefill.step(size, wait=not beside)
            if not beside:  # launched beside a decode step, it is not timed alone
                self._placement.chunks.observe(tokens, time.perf_counter() - started)
            if not prefill.done:
                return tokens
            prompt = prefill.prompt
            remaining = sequence.request.max_tokens - sequence.generated
            self._placement.start(
                sequence, Start(prompt[-1:], prefill.cache, prompt[:-1], remaining)
            )
        except Exception:  # fails this request only
            log.exception("could not prefill the images of sequence %d", sequence.seq_id)
            self._ledger.finish(sequence, sequence.final("error", COULD_NOT_START))
        return max(tokens, 1)
