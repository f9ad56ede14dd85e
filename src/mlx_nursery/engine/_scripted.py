"""The scripted model's stepper: each sequence's tokens and timing come from its `Script`.

It stands where `BatchStepper` stands for a real model (the `Runner` uses it as its only
stepper: no fast path, no handover), so a scripted request takes the real path: lanes,
queue, deadlines, the ledger, the outbox, cancellation and the HTTP layer. Its decode step
is the wait for the next due piece, cut into slices of at most `SLICE_SECONDS`: the worker
sees a cancel, a deadline or a shutdown within one slice, as it sees them within one
decode step of a real model. Engine thread only.

`ChunkDetokenizer` gives a script written as chunks its text as written, a chunk at a time
(in the consumer's task, as every stream's detokenizer runs).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Literal

import attrs
import mlx.core as mx

from ._detokenizer import TokenTexts
from ._sequence import LiveSequence, Response
from ._stepper import KVState, Start
from ._types import GenerationRequest, Script
from ._upstream import StreamingDetokenizer

SLICE_SECONDS = 0.02
"""The longest one step sleeps: the scripted model's bound on a cancel's latency."""

_END = Script()
"""A request without a script ends at once (the testing package's harness gives one to every
request to a scripted model)."""


class ScriptedFault(RuntimeError):
    """A script's `error_after`: the sequence fails as a real failure would."""


@attrs.frozen
class ScriptedResponse:
    """Shaped like `BatchGenerator`'s responses, so the runner handles it alike."""

    uid: int
    token: int
    logprobs: mx.array
    finish_reason: str | None
    prompt_cache: list[Any] | None = None
    all_tokens: list[int] | None = None


@attrs.define
class _Scripted:
    sequence: LiveSequence
    script: Script
    max_tokens: int
    due: float
    """When its next piece (or its end) is due (`time.monotonic`)."""
    piece: int = 0
    """Its next piece (a replay starts past the pieces it posted)."""
    emitted: int = 0


class ScriptedStepper:
    """Steps sequences by their scripts: no MLX compute, only the scripts' waits."""

    kind: Literal["solo", "batch"] = "batch"
    drafting: frozenset[int] = frozenset()  # no batch rows drafting here

    def __init__(
        self,
        vocab_size: int,
        eos: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._eos = eos
        self._clock = clock
        self._sleep = sleep
        # One row for every token: each token is as likely as any (logprobs a client asked
        # for are honest about there being no model); the runner checks ids against its size.
        self._row = mx.full((vocab_size,), -math.log(vocab_size), dtype=mx.float32)
        self._running: dict[int, _Scripted] = {}
        self._next_uid = 0

    def insert(self, sequence: LiveSequence, start: Start) -> int:
        script = sequence.request.script or _END
        entry = _Scripted(sequence, script, start.max_tokens, self._clock())
        # A replay continues where the sequence's posted tokens end (whole pieces only).
        posted = len(sequence.tokens)
        while entry.piece < len(script.pieces) and posted >= len(script.pieces[entry.piece]):
            posted -= len(script.pieces[entry.piece])
            entry.piece += 1
        entry.due += script.delays[entry.piece]
        uid = self._next_uid
        self._next_uid += 1
        self._running[uid] = entry
        return uid

    def step(self) -> list[Response]:
        """Wait for the earliest due piece (at most `SLICE_SECONDS`), then return every due
        piece's tokens: one piece per sequence. A sequence whose script faults records a
        `ScriptedFault` in its failures after its last piece (the runner fails it)."""
        if not self._running:
            return []
        now = self._clock()
        earliest = min(entry.due for entry in self._running.values())
        if earliest > now:
            self._sleep(min(earliest - now, SLICE_SECONDS))
            now = self._clock()
        responses: list[Response] = []
        for uid, entry in list(self._running.items()):
            if entry.due <= now:
                responses += self._advance(uid, entry)
        return responses

    def _advance(self, uid: int, entry: _Scripted) -> list[ScriptedResponse]:
        """The sequence's next piece (its tokens), then its end if that is due too: its EOS
        after its last piece, or its fault after `error_after` pieces."""
        script = entry.script
        pieces = script.pieces
        fault_at = None if script.error_after is None else min(script.error_after, len(pieces))
        out: list[ScriptedResponse] = []
        if entry.piece < len(pieces) and (fault_at is None or entry.piece < fault_at):
            for token in pieces[entry.piece]:
                entry.emitted += 1
                if token in entry.sequence.stop_ids:
                    reason: str | None = "stop"
                elif entry.emitted >= entry.max_tokens:
                    reason = "length"
                else:
                    reason = None
                out.append(ScriptedResponse(uid, token, self._row, reason))
                if reason is not None:
                    del self._running[uid]
                    return out
            entry.piece += 1
        if fault_at is not None and entry.piece >= fault_at:
            entry.sequence.failures.append(
                ScriptedFault(f"scripted fault after {entry.piece} pieces of output")
            )
            entry.due = math.inf  # it steps no more: the runner ends it after this step
        elif entry.piece < len(pieces):
            entry.due += script.delays[entry.piece]
        else:
            out.append(ScriptedResponse(uid, self._eos, self._row, "stop"))
            del self._running[uid]
        return out

    def remove(self, uids: list[int], *, keep_state: bool) -> dict[int, KVState]:
        """Drop sequences at once (nothing is in flight); there is no KV state to keep."""
        for uid in uids:
            self._running.pop(uid, None)
        return {}

    def close(self) -> None:
        self._running.clear()

    @property
    def uids(self) -> frozenset[int]:
        return frozenset(self._running)

    @property
    def prefilled(self) -> int:
        return 0  # nothing is computed

    @property
    def token_in_flight(self) -> bool:
        return False


class ChunkDetokenizer(StreamingDetokenizer):  # type: ignore[misc]  # untyped base
    """The text of a script written as chunks (`Script.texts`): nothing until a chunk's last
    token, then the chunk exactly as written. A streaming detokenizer cuts text where the
    tokens allow (it holds back a trailing space, or a word until the next begins), so a
    test harness could not say what a chunk delivers. A chunk cut short (by `max_tokens`, a
    stop token) gives what `fallback`, a real detokenizer, makes of its tokens; a token past
    the pieces (the end's EOS) stands for nothing."""

    def __init__(self, script: Script, fallback: StreamingDetokenizer) -> None:
        if script.texts is None:
            raise ValueError("a script without chunk texts has a real detokenizer")
        self._sizes = [len(piece) for piece in script.pieces]
        self._texts = script.texts
        self._fallback = fallback
        self.reset()

    def reset(self) -> None:
        self._piece = 0
        self._held: list[int] = []
        self.tokens: list[int] = []
        self.text = ""
        self.offset = 0  # the base's `last_segment`: the text past it
        self._fallback.reset()

    def add_token(self, token: int) -> None:
        self.tokens.append(token)
        while self._piece < len(self._sizes) and self._sizes[self._piece] == 0:
            self._piece += 1  # an empty chunk: no token comes for it
        if self._piece >= len(self._sizes):
            return
        self._held.append(token)
        if len(self._held) == self._sizes[self._piece]:
            self.text += self._texts[self._piece]
            self._piece += 1
            self._held = []

    def finalize(self) -> None:
        if self._held:
            for token in self._held:
                self._fallback.add_token(token)
            self._fallback.finalize()
            self.text += str(self._fallback.last_segment)
            self._held = []


def request_detokenizer(request: GenerationRequest, texts: TokenTexts) -> StreamingDetokenizer:
    """A request's detokenizer: a `ChunkDetokenizer` where its script is written as chunks
    (its text as written: nothing trimmed, nor in a chunk cut short, which may start with
    a space), else a real one that trims the text's leading space as the request says."""
    script = request.script
    if script is None or script.texts is None:
        return texts.detokenizer(trim_space=request.trim_leading_space)
    return ChunkDetokenizer(script, texts.detokenizer(trim_space=False))
