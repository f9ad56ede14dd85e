"""A sequence's token, from a stepper's response to the outbox. Engine thread only."""

from __future__ import annotations

import logging

from ._counters import RunCounters
from ._ledger import Ledger, SeqState
from ._messages import StepEvent
from ._outbox import Outbox
from ._sequence import LiveSequence, Response, token_logprob
from ._stepper import Stepper
from ._types import FinishReason

log = logging.getLogger("mlx_nursery.engine")


class Emitter:
    """Turns responses into events: a token, or a final event that ends the sequence and
    keeps its KV state for the prefix cache."""

    def __init__(self, ledger: Ledger, outbox: Outbox, counters: RunCounters) -> None:
        self._ledger = ledger
        self._outbox = outbox
        self._counters = counters

    def checked(self, sequence: LiveSequence, response: Response, stepper: Stepper) -> None:
        """`token`, failing this sequence alone if its token or logprobs are unusable."""
        try:
            vocabulary = response.logprobs.shape[-1]
            if not 0 <= int(response.token) < vocabulary:
                raise ValueError(f"sampled token {int(response.token)} is outside the vocabulary")
            self.token(sequence, response)
        except Exception as exc:  # noqa: BLE001 - isolated per request by design
            log.warning("could not emit a token of sequence %d: %r", sequence.seq_id, exc)
            if self._ledger.state_of(sequence.seq_id) is SeqState.ACTIVE:
                self._ledger.remove(
                    sequence, stepper, "error", "the engine could not read this request's token"
                )

    def token(self, sequence: LiveSequence, response: Response) -> None:
        """Post the response's token (a stop token is never shown); a final one ends the
        sequence, which its stepper has already dropped."""
        logprob = (
            token_logprob(sequence, response) if sequence.request.logprobs is not None else None
        )
        sequence.generated += 1
        sequence.tokens.append(int(response.token))
        self._counters.generated_tokens += 1
        reason: FinishReason | None = response.finish_reason
        token = None if reason == "stop" else int(response.token)
        if reason is None:
            self._outbox.token(sequence.seq_id, StepEvent(token, logprob))
            return
        final = StepEvent(token, logprob, reason, sequence.usage())
        self._ledger.finish(sequence, final, (response.prompt_cache, response.all_tokens))
