"""The single-sequence fast path's sequence: one sequence stepped the way mlx-lm's
`generate_step` does (`SoloStepper`, `_solo.py`, runs it as the engine's stepper).

Why it exists: mlx-lm's `BatchGenerator` at batch size 1 decodes markedly slower than
`generate_step` on a GPU (docs/architecture.md, "Single-sequence fast path"), because of its
batch KV caches and per-row plumbing. While one sequence is alone on the engine it runs
here, on a plain KV cache with the same one-step-ahead pipelining as `generate_step`. When
a second sequence arrives, the lone one moves into the batch with its KV cache
(`SoloStepper.handover`), exactly as a prefix-cache hit is inserted.

Behaviour is identical on both paths: the same sampler object draws each token exactly
once (so seeded requests reproduce), logits processors see the same context (the prompt
and every token fed so far), and a step returns at most one token per call, with prefill
in chunks of at most `prefill_step_size` so that a cancel is honoured between chunks (a
lone prompt's chunks are never shrunk: nothing decodes beside them; their times still
teach the chunk sizer, `_chunking.py`, what a token costs).

With speculation on, a step may verify drafted tokens and return several (`_speculating.py`;
the batch's rows: `_batch_speculating.py`); a step without drafts is the one above.

We do not call `generate_step` itself: a generator can't hand its KV cache and its
in-flight token over to the batch, and the handover is what keeps behaviour identical.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import mlx.core as mx

from ._kv_quant import CacheFactory
from ._speculating import Speculator, SpeculatorFactory, Verify
from ._stepper import Start
from ._upstream import generation_stream, make_prompt_cache


@attrs.frozen
class SoloResponse:
    """Shaped like `BatchGenerator`'s responses, so the worker handles both alike."""

    uid: int
    token: int
    logprobs: mx.array
    finish_reason: str | None
    prompt_cache: list[Any] | None
    all_tokens: list[int] | None


@attrs.frozen
class Handover:
    """What the batch needs to continue a solo sequence identically."""

    start: Start
    response: SoloResponse | None
    """The token that was in flight, now returned (None if decoding had not started)."""


class SoloSequence:
    """One lone sequence on a plain KV cache: its prompt's prefill chunks, then a token a
    step (or, speculating, a verify's tokens), computed one step ahead. Engine thread only."""

    def __init__(
        self,
        model: Any,
        uid: int,
        start: Start,
        *,
        sampler: Any,
        processors: list[Any],
        stop_tokens: frozenset[int],
        prefill_step_size: int,
        before_launch: Callable[[], None] | None = None,
        make_cache: CacheFactory = make_prompt_cache,
        chunk_timed: Callable[[int, float], None] | None = None,
        speculate: SpeculatorFactory | None = None,
    ) -> None:
        self.uid = uid
        self._model = model
        self._cache = start.cache if start.cache is not None else make_cache(model)
        self._cache_tokens: list[int] = list(start.cache_tokens)
        """The tokens in the KV cache, as Python ints (a sampled one is added once read)."""
        self._pending: list[int] = list(start.prompt)
        self._sampler = sampler
        self._processors = processors
        self._context = mx.array(self._cache_tokens, dtype=mx.uint32) if processors else None
        self._max_tokens = start.max_tokens
        self._stop = stop_tokens
        self._step_size = prefill_step_size
        self._before_launch = before_launch
        self._chunk_timed = chunk_timed
        """Told the tokens and seconds of each prefill chunk and of the prompt's last forward,
        which gives the first token (the chunk sizer learns from them)."""
        self._in_flight: tuple[mx.array, mx.array] | None = None
        self._verify: Verify | None = None
        """A verify step in flight (speculation): its inputs are not in `_cache_tokens` yet."""
        self._built_after_read = False
        """The plain step in flight was built only after the last read (not overlapping the
        step before it): its read's interval is not a plain step's cost."""
        self._speculator = (
            speculate(self._cache, self._cache_tokens + self._pending) if speculate else None
        )
        self._returned = 0
        self.prefilled = 0
        """Prompt tokens run by prefill chunks (the last prompt token is run by the first step)."""

    def step(self) -> list[SoloResponse]:
        """Advance by one prefill chunk (returns nothing), by one token, or, speculating, by
        the tokens of one verify step.

        The prompt's last chunk and its first token are one forward pass, as in
        `generate_step`. The first token comes straight back (time to first token);
        from the second on, each token is returned while the next one computes.
        """
        if self._in_flight is None and self._verify is None:
            if len(self._pending) > self._step_size:
                self._prefill_chunk()
                return []
            fed = self._pending
            if self._returned == 0:
                started = time.perf_counter()
                self._in_flight = self._forward(mx.array(fed, dtype=mx.uint32))
                self._cache_tokens.extend(fed)
                self._pending = []
                self.prefilled += len(fed) - 1  # counted as the batch counts: the last is decode's
                response = self._take_in_flight(launch_next=False)  # read: the time is real
                if self._chunk_timed is not None:
                    self._chunk_timed(len(fed), time.perf_counter() - started)
                return [response]
            self._pending = []
            self._launch_after(fed[0])
        if self._verify is not None:
            return self._take_verify()
        return [self._take_in_flight(launch_next=True)]

    def _room(self) -> int:
        """Tokens this sequence may still return."""
        return self._max_tokens - self._returned

    def _launch_after(self, token: int, planned: int | None = None) -> None:
        """Launch the step after `token` (read, not fed): a verify if drafts are found.
        `planned`: the drafts the control chose for this step already (None: ask it)."""
        speculator = self._speculator
        drafts: list[int] = []
        if speculator is not None:
            planned = speculator.plan() if planned is None else planned
            drafts = speculator.drafts(planned, self._room() - 1, ahead=False)
        first = mx.array([token], dtype=mx.uint32)
        if speculator is not None and drafts:
            self._verify = speculator.launch(
                self._cache, first, drafts, self._before_launch, ahead=False
            )
            self._verify.first = token
        else:
            self._in_flight = self._forward(first)
            self._built_after_read = True
            self._cache_tokens.append(token)

    def _take_in_flight(self, *, launch_next: bool) -> SoloResponse:
        assert self._in_flight is not None
        token_array, logprobs = self._in_flight
        self._in_flight = None
        self._returned += 1
        speculator = self._speculator
        built_after_read, self._built_after_read = self._built_after_read, False
        if launch_next and self._returned < self._max_tokens:
            # Launch the next token before reading this one: the device keeps busy while Python
            # handles this token (generate_step's pipelining). A stop token wastes that step,
            # as it does in generate_step and BatchGenerator.
            drafts = (
                speculator.drafts(speculator.plan(), self._room() - 1, ahead=True)
                if speculator
                else []
            )
            if speculator is not None and drafts:
                self._verify = speculator.launch(
                    self._cache, token_array, drafts, self._before_launch, ahead=True
                )
            else:
                self._in_flight = self._forward(token_array)
        token = int(token_array.item())  # type: ignore[arg-type]  # a token id is an int
        if speculator is not None:
            speculator.plain_read(timed=self._verify is None, pipelined=not built_after_read)
            speculator.index.extend((token,))
        reason = (
            "stop"
            if token in self._stop
            else "length"
            if self._returned >= self._max_tokens
            else None
        )
        if self._in_flight is not None:
            self._cache_tokens.append(token)
        elif self._verify is not None:
            self._verify.first = token  # fed by the verify: in the cache once it resolves
        elif reason is None:
            self._pending = [token]  # not fed yet: the next step feeds it
        if reason is None:
            return SoloResponse(self.uid, token, logprobs, None, None, None)
        if self._verify is not None:
            assert speculator is not None
            speculator.discard(self._verify, self._cache)  # its inputs leave the cache
            self._verify = None
        self._in_flight = None
        return SoloResponse(
            self.uid, token, logprobs, reason, self._cache, list(self._cache_tokens)
        )

    def _take_verify(self) -> list[SoloResponse]:
        """Launch the next verify behind the one in flight, as if all its drafts were
        accepted, then read it (so the device computes while the host reads and emits, as
        plain steps do); keep the next one if they were, else launch the next step now;
        return its tokens."""
        verify, speculator = self._verify, self._speculator
        assert verify is not None and speculator is not None
        self._verify = None
        planned, behind = self._launch_behind(verify, speculator)
        outcome = speculator.resolve(verify, self._cache, self._room(), self._stop, behind)
        self._cache_tokens.append(outcome.first)
        self._cache_tokens.extend(outcome.tokens[: outcome.accepted])
        speculator.index.extend(outcome.tokens)
        responses: list[SoloResponse] = []
        for i, token in enumerate(outcome.tokens[:-1]):
            responses.append(SoloResponse(self.uid, token, verify.logprobs[i], None, None, None))
        last = outcome.tokens[-1]
        self._returned += len(outcome.tokens)
        logprobs = verify.logprobs[len(outcome.tokens) - 1]
        reason = (
            "stop"
            if last in self._stop
            else "length"
            if self._returned >= self._max_tokens
            else None
        )
        if reason is None:
            if outcome.continued:
                self._verify = behind
            else:
                self._launch_after(last, planned)
            responses.append(SoloResponse(self.uid, last, logprobs, None, None, None))
        else:
            responses.append(
                SoloResponse(
                    self.uid, last, logprobs, reason, self._cache, list(self._cache_tokens)
                )
            )
        return responses

    def _launch_behind(
        self, verify: Verify, speculator: Speculator
    ) -> tuple[int | None, Verify | None]:
        """The control's drafts for the step after `verify`, and that step launched behind
        it if prompt lookup finds drafts past all of `verify`'s and the sequence's verifies
        mostly keep all their drafts (None: not launched)."""
        room = self._room() - verify.positions  # left if every draft is accepted
        if room <= 1 or not speculator.pipelines or not speculator.control.follows_through:
            return None, None
        planned = speculator.plan()
        drafts = speculator.drafts(planned, room - 1, ahead=True, assumed=verify.drafts)
        if not drafts:
            return planned, None
        behind = speculator.launch(
            self._cache,
            verify.tokens[-1:],
            drafts,
            self._before_launch,
            ahead=False,
            behind=verify,
        )
        return planned, behind

    def _prefill_chunk(self) -> None:
        chunk = self._pending[: self._step_size]
        started = time.perf_counter()
        with mx.stream(generation_stream):
            self._model(mx.array(chunk, dtype=mx.uint32)[None], cache=self._cache)
            mx.eval([c.state for c in self._cache])
        if self._chunk_timed is not None:
            self._chunk_timed(len(chunk), time.perf_counter() - started)
        self.prefilled += len(chunk)
        self._cache_tokens.extend(chunk)
        if self._context is not None:
            self._context = mx.concatenate([self._context, mx.array(chunk, dtype=mx.uint32)])
        self._pending = self._pending[len(chunk) :]

    def _forward(self, inputs: mx.array) -> tuple[mx.array, mx.array]:
        """Feed `inputs` (1-D), sample the next token; lazy, started with async_eval.

        On mlx-lm's thread-local generation stream, as BatchGenerator and generate_step:
        on the default stream async_eval waits for prior work on CUDA. `before_launch` runs
        once the graph is built, just before the launch (the outbox's posting rule). The
        sampled token stays the sampler's 1-element array and is fed back as it is, as in
        generate_step: indexing it to a scalar and reshaping it back cost a lone stream
        measurably on CUDA (docs/architecture.md, "Single-sequence fast path").
        """
        with mx.stream(generation_stream):
            logits = self._model(inputs[None], cache=self._cache)[:, -1, :]
            if self._processors:
                assert self._context is not None
                self._context = mx.concatenate([self._context, inputs.astype(mx.uint32)])
                for processor in self._processors:
                    logits = processor(self._context, logits)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            token = self._sampler(logprobs)
            logprobs = logprobs.squeeze(0)
        if self._before_launch is not None:
            self._before_launch()
        mx.async_eval(token, logprobs)  # type: ignore[no-untyped-call]
        return token, logprobs

    @property
    def token_in_flight(self) -> bool:
        """A next token is computing that the next `step` launches another before it waits
        for (a verify in flight is waited for first: its step's tokens are posted at once)."""
        return self._in_flight is not None

    def _drop_verify(self) -> None:
        """Discard a verify in flight: the cache back to the tokens it held before, the
        verify's first input (emitted already) pending again, as before a plain launch."""
        if self._verify is not None:
            assert self._speculator is not None and self._verify.first is not None
            self._speculator.discard(self._verify, self._cache)
            self._pending = [self._verify.first]
            self._verify = None

    def handover(self) -> Handover:
        """Stop stepping here; return what the batch needs to continue identically.

        A token in flight was sampled already (its draw is spent): it is returned now, in
        `response`, and the batch continues from it. A verify in flight is discarded (its
        draws were not spent): the batch continues from its first input, no draft left in
        the KV cache.
        """
        response = None
        self._drop_verify()
        if self._in_flight is not None:
            response = self._take_in_flight(launch_next=False)  # leaves its token in _pending
        start = Start(
            list(self._pending),
            self._cache,
            list(self._cache_tokens),
            self._max_tokens - self._returned,
        )
        return Handover(start, response)

    def cancel(self) -> tuple[list[Any], list[int]]:
        """Stop; return the KV cache and the tokens it holds (for the prefix cache)."""
        self._drop_verify()
        if self._in_flight is not None:
            mx.eval(self._in_flight[0])  # let the step in flight land before the cache is kept
            self._in_flight = None
        return self._cache, list(self._cache_tokens)
