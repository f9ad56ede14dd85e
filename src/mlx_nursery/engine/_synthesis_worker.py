"""The synthesis thread: it loads a TTS model and runs its syntheses, one at a time.

It knows nothing of Trio; the queue, the stop flags, the posts and the confirmations are
`LaneWorker`'s (`_lane_worker.py`), as the speech thread's are. What is its own: the model,
run a sentence at a time through its generator; the stop flag checked before each sentence
and between the pieces the generator yields (closing the generator: the model computes
nothing more); a chunk posted per piece; and its counters.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

from ..models import SynthesisModel
from ._errors import EngineUnavailable
from ._lane_worker import LaneJob, LanePost, LaneWorker
from ._synthesis_types import (
    AudioChunk,
    SynthesisModelInfo,
    SynthesisRequest,
    Synthesized,
    sentences,
)

SynthesisEvent = AudioChunk | Synthesized | EngineUnavailable
"""What a synthesis's channel carries: chunks, then `Synthesized` or an error."""


@attrs.frozen
class SynthesisCounters:
    """The synthesis thread's counters since it started, as of one post."""

    running: bool = False
    chunks: int = 0
    samples: int = 0
    cancelled: int = 0


SynthesisPost = LanePost[AudioChunk | Synthesized, SynthesisCounters]
"""One hop to Trio: a synthesis's news, with the thread's counters."""


class SynthesisWorker(
    LaneWorker[
        SynthesisRequest,
        SynthesisModelInfo,
        SynthesisModel,
        AudioChunk | Synthesized,
        SynthesisCounters,
    ]
):
    """A TTS model's thread (`LaneWorker`): `submit` and `stop` from the Trio thread."""

    what = "synthesis engine"
    job_name = "synthesis"

    def __init__(
        self,
        model: Path,
        post: Callable[[SynthesisPost], None],
        on_ready: Callable[[SynthesisModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        super().__init__(post, on_ready, on_exit)
        self._model_path = model
        # This thread's alone, as the base's are.
        self._chunks = 0
        self._samples = 0

    def _load(self) -> tuple[SynthesisModelInfo, SynthesisModel]:
        from ..models import load_synthesis_model

        model = load_synthesis_model(self._model_path)
        info = SynthesisModelInfo(
            str(model.path), model.model_type, model.sample_rate, model.voices
        )
        return info, model

    def _work(self, job: LaneJob[SynthesisRequest], model: SynthesisModel) -> Synthesized:
        """One synthesis, a sentence at a time: a chunk per piece the model yields."""
        request = job.request
        chunks = samples = tokens = 0
        for sentence in sentences(request.text):
            job.check("synthesis_chunk")
            pieces = model.synthesize(sentence, request.voice, request.speed)
            try:
                for piece in pieces:
                    job.check("synthesis_chunk")
                    size = len(piece.samples)
                    chunks, samples, tokens = chunks + 1, samples + size, tokens + piece.tokens
                    self._chunks, self._samples = self._chunks + 1, self._samples + size
                    chunk = AudioChunk(piece.samples, model.sample_rate, piece.tokens)
                    self._send(job.job_id, chunk, ended=False)
            finally:
                pieces.close()  # a stopped generator computes nothing more
        return Synthesized(chunks, samples, tokens, model.sample_rate)

    def _counters(self) -> SynthesisCounters:
        return SynthesisCounters(self._running, self._chunks, self._samples, self._cancelled)
