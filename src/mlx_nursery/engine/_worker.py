"""The engine thread: the only thread that touches MLX for the engine's whole life.

It loads the model, then loops: take commands (submit, cancel, stop) from a
thread-safe queue, apply them *before* the next step (so a cancelled sequence
computes nothing more and a sequence cancelled while still queued computes
nothing at all), run one `BatchGenerator.next()` (one decode step for the
batch plus at most one prefill chunk), and post the step's events for the whole
batch to Trio in one hop. It knows nothing of Trio: it is handed a `post`
callable.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import attrs
import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences, generation_stream
from mlx_lm.models.cache import make_prompt_cache

from ..models import LoadedModel, load_model
from ._config import EngineConfig
from ._detokenizer import TokenBytes
from ._prefix_cache import CacheHit, PrefixCache, PrefixCacheStats
from ._sampling import make_request_processors, make_request_sampler, rewind_sampler
from ._solo import SoloSequence
from ._types import FinishReason, GenerationRequest, TokenLogprob, Usage

log = logging.getLogger("mlx_nursery.engine")

_IDLE_POLL_SECONDS = 1.0
_CONFIRMATION_HEADSTART_SECONDS = 0.002
_MAX_REASON_CHARS = 500
"""Of an exception's text kept in logs and error events (a grammar's may quote all of it)."""
_STRIKES_TO_BLAME = 2
"""Failed steps a sequence must be the one suspect of before it is failed alone."""
"""Longest the thread waits for Trio to take a cancel's confirmation before detaching."""


class FatalEngineError(RuntimeError):
    """The engine cannot continue (repeated batch failures, or a bug in the loop)."""


@attrs.frozen
class Submit:
    seq_id: int
    request: GenerationRequest


@attrs.frozen
class Cancel:
    seq_id: int


@attrs.frozen
class Stop:
    pass


Command = Submit | Cancel | Stop


@attrs.frozen
class WorkerStats:
    """Counters since the engine started. `prompt_tokens_processed` counts prefill-chunk
    tokens: each prompt's last token is run by its first decode step instead."""

    steps: int
    active: int
    prompt_tokens_processed: int
    generated_tokens: int
    failed_steps: int
    prefix_cache: PrefixCacheStats | None
    solo_steps: int = 0
    """Steps run on the single-sequence fast path (the rest went through BatchGenerator)."""
    handovers: int = 0
    """Lone sequences moved into the batch when company arrived."""
    isolated_failures: int = 0
    """Sequences failed alone because a step failed with them as the one suspect."""
    replays: int = 0
    """Sequences rebuilt (prompt and tokens so far prefilled again) after a failed step."""


class StepEvent(NamedTuple):
    """One sequence's output in a step, before detokenizing.

    The receiving side turns it into a `TokenEvent`: it detokenizes there, on its own
    thread, while this one launches the next step. Detokenizing was the largest piece of
    Python a token cost this thread, which a lone stream of a large model is bound by.
    """

    token_id: int | None
    logprob: TokenLogprob | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None

    @property
    def is_final(self) -> bool:
        return self.finish_reason is not None


@attrs.frozen
class Delivery:
    """One hop to Trio: every event of a step, and the sequences confirmed gone."""

    events: list[tuple[int, StepEvent]]
    finished: list[int]
    stats: WorkerStats
    closing: Literal["closed", "failed"] | None = None  # set on the thread's last delivery


@attrs.frozen
class ModelInfo:
    """What the Trio side may know about the loaded model (no MLX objects)."""

    path: str
    tokenizer: Any
    context_length: int
    eos_token_ids: frozenset[int]
    token_bytes: Callable[[int], bytes]
    """A token id's exact bytes (`_detokenizer.TokenBytes`)."""


@attrs.define
class _Sequence:
    seq_id: int
    uid: int
    request: GenerationRequest
    failures: list[BaseException]
    cached_tokens: int
    sampler: Any
    processors: list[Any]
    stop_ids: frozenset[int]
    generated: int = 0
    solo: SoloSequence | None = None
    """Set while the sequence runs alone on the fast path, outside the BatchGenerator."""
    tokens: list[int] = attrs.Factory(list)
    """Every token posted so far: with the prompt, what a replay prefills."""
    newcomer: bool = True
    """Inserted since its last token: a suspect if a step fails now (see `_recover`)."""
    strikes: int = 0
    """Failed steps in which it was the one suspect."""

    def usage(self) -> Usage:
        return Usage(len(self.request.prompt_tokens), self.generated, self.cached_tokens)


class Worker:
    def __init__(
        self,
        config: EngineConfig,
        post: Callable[[Delivery], None],
        on_ready: Callable[[ModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        self._config = config
        self._post = post
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._active: dict[int, _Sequence] = {}  # by BatchGenerator uid
        self._uids: dict[int, int] = {}  # seq_id -> uid
        self._events: list[tuple[int, StepEvent]] = []
        self._finished: list[int] = []
        self._cache: PrefixCache | None = None
        self._generator: BatchGenerator | None = None
        self._model: LoadedModel | None = None
        self._eos: frozenset[int] = frozenset()
        self.steps = 0  # read from Trio for cancellation accounting (an int: atomic under the GIL)
        self._prompt_tokens = 0
        self._generated_tokens = 0
        self._failed_steps = 0
        self._failures_in_a_row = 0
        self._solo: _Sequence | None = None
        self._detaching: list[tuple[_Sequence, SoloSequence | None]] = []
        """Ended sequences still in the batch (or on the fast path) until the next detach."""
        self._to_store: list[tuple[_Sequence, Any, Any]] = []
        """Sequences ended this iteration (finished, or detached after a cancel), with their KV
        state, for the prefix cache: stored once their final events are posted, so that no
        final event waits for a store (slicing every layer's KV, a trie walk over every token)."""
        self._solo_steps = 0
        self._handovers = 0
        self._isolated_failures = 0
        self._replays = 0
        self._probation: dict[int, _Sequence] = {}
        """By seq_id: sequences of a failed step waiting to be replayed one at a time."""
        self._held: list[Submit] = []
        """Submissions that arrived during probation: admitted once it is over, so that new
        arrivals (each a newcomer for all its prefill) cannot keep a suspect from its replay."""
        self._previous_responses: list[Any] = []
        """The last step's responses (MLX arrays), released only once the next step has run."""
        self._confirmation_seen = threading.Event()
        """Set by the receiving side once a caller has seen a sequence's end; cleared when a
        delivery that confirms sequences gone is posted (see `_detach_removed`). A caller
        acknowledging an earlier end may end a wait early: it is a head start, not a handshake."""
        self._post_at_launch = True
        """While a lone sequence has its next token in flight, post its token at the next launch.

        A lone stream of a large model is bound by this thread. Per token on an H100 (8B,
        bench/lone_stream_phases.py): 2.5 ms of Python builds the graph, holding the GIL, and
        4.3 ms in `mx.async_eval` launches it, without the GIL. A token posted as soon as it
        is read wakes the receiving (Trio) thread during the build; the receiver then waits
        for the GIL until the launch (2.7 ms median from post to delivery), and a build that
        ran past the interpreter's switch interval (5 ms) would be interrupted for it. Posted
        just before the launch, the token is taken at once (0.14 ms) and handled during the
        launch, and no build is ever interrupted; it reaches the consumer at about the same
        time either way. Measured effect on the rate: 1-4% faster in two H100 runs of five,
        within 1% in the other three. A first or final token is never held back.
        """

    # -- called from any thread -------------------------------------------------------------
    def submit(self, seq_id: int, request: GenerationRequest) -> None:
        self._commands.put(Submit(seq_id, request))

    def cancel(self, seq_id: int) -> None:
        self._commands.put(Cancel(seq_id))

    def stop(self) -> None:
        self._commands.put(Stop())

    def confirmation_seen(self) -> None:
        """The receiving side calls this once a caller has seen a sequence's end (its final
        event, or the confirmation it waited for after a cancel): detaching waits for that,
        briefly."""
        self._confirmation_seen.set()

    # -- the thread -------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._model = load_model(self._config.model)
            self._eos = frozenset(int(t) for t in self._model.tokenizer.eos_token_ids)
            if self._config.prompt_cache_bytes > 0:
                self._cache = PrefixCache(
                    max_bytes=self._config.prompt_cache_bytes,
                    max_entries=self._config.prompt_cache_entries,
                    ttl=self._config.prompt_cache_ttl,
                )
            self._generator = self._new_generator()
        except BaseException as exc:  # noqa: BLE001 - reported to the Trio side, which raises it
            self._on_ready(None, exc)
            self._on_exit(exc)
            return
        self._on_ready(self._model_info(), None)
        reason: BaseException | None = None
        try:
            self._loop()
        except BaseException as exc:  # a dead loop must still release everyone
            log.exception("engine loop failed; the engine is stopping")
            reason = exc
        finally:
            self._finish_all("error" if reason else "cancelled", reason)
            self._flush(closing="failed" if reason else "closed")
            self._release_memory()
            self._on_exit(reason)

    def _model_info(self) -> ModelInfo:
        assert self._model is not None
        return ModelInfo(
            path=str(self._model.path),
            tokenizer=self._model.tokenizer,
            context_length=self._model.context_length,
            eos_token_ids=self._eos,
            token_bytes=TokenBytes(self._model.tokenizer),
        )

    def _new_generator(self) -> BatchGenerator:
        assert self._model is not None
        return BatchGenerator(
            self._model.model,
            completion_batch_size=self._config.max_concurrency,
            prefill_batch_size=min(self._config.prefill_batch_size, self._config.max_concurrency),
            prefill_step_size=self._config.prefill_step_size,
        )

    def _loop(self) -> None:
        next_expiry_check = time.monotonic()
        while True:
            if not self._active:
                self._previous_responses = []  # no next step: nothing to wait for
            idle = not (self._active or self._probation or self._held)
            if self._apply(self._take_commands(block=idle)):
                return
            self._settle()
            if self._probation:
                self._replay_next_suspect()
            elif self._held:
                held, self._held = self._held, []
                self._admit_all(held)
            if self._active:
                self._step()
            if self._cache is not None and time.monotonic() >= next_expiry_check:
                next_expiry_check = time.monotonic() + min(_IDLE_POLL_SECONDS, self._cache.ttl)
                if self._cache.evict_expired():
                    self._flush(force=True)
            self._settle()  # again for those the step ended (a failed logits processor)

    def _settle(self) -> None:
        """Post what is due, then detach and store what ended.

        Confirmations go out first, then the sequences are detached: a sequence ended is
        always detached before the next command is applied, so a lane it freed is never
        used twice. Called twice per token, so the common case (nothing ended) is a few
        checks: on a lone stream this thread's Python is the token's bottleneck.
        """
        self._flush_step()
        if self._detaching:
            self._detach_removed()
        if self._to_store:
            self._store_finished()

    def _take_commands(self, *, block: bool) -> list[Command]:
        commands: list[Command] = []
        if block:
            try:
                commands.append(self._commands.get(timeout=_IDLE_POLL_SECONDS))
            except queue.Empty:
                return commands
        while not self._commands.empty():  # this thread is the only reader
            commands.append(self._commands.get_nowait())
        return commands

    def _apply(self, commands: list[Command]) -> bool:
        """Apply commands; return True on Stop. Cancels win over submits of the same batch."""
        if not commands:
            return False
        stop = any(isinstance(c, Stop) for c in commands)
        cancelled = {c.seq_id for c in commands if isinstance(c, Cancel)}
        for seq_id in cancelled:
            uid = self._uids.get(seq_id)
            if uid is not None:
                self._remove(uid, "cancelled")
            elif seq_id in self._probation:
                self._end_suspect(self._probation.pop(seq_id), "cancelled")
        for held in [c for c in self._held if c.seq_id in cancelled]:
            self._held.remove(held)
            self._finish_unstarted(held, "cancelled")
        admitted: list[Submit] = []
        for command in commands:
            if isinstance(command, Submit):
                if stop or command.seq_id in cancelled:
                    self._finish_unstarted(command, "cancelled")
                else:
                    admitted.append(command)
        if admitted and self._probation:
            self._held += admitted
        elif admitted:
            self._admit_all(admitted)
        return stop

    # -- admission ---------------------------------------------------------------------------
    def _admit_all(self, commands: list[Submit]) -> None:
        """A lone sequence takes the fast path; any company moves everyone into the batch."""
        fast = self._config.single_sequence_fast_path and not self._probation
        if fast and not self._active and len(commands) == 1:
            self._admit(commands[0], solo=True)
            return
        if self._solo is not None:
            self._hand_over_solo()
        for command in commands:
            self._admit(command, solo=False)

    def _admit(self, command: Submit, *, solo: bool) -> None:
        """Start one sequence. Anything that fails here fails this request alone: building
        its sampler and processors, fetching its cached prefix, starting it."""
        assert self._generator is not None and self._model is not None
        request = command.request
        prompt = list(request.prompt_tokens)
        try:
            failures: list[BaseException] = []
            sequence = _Sequence(
                seq_id=command.seq_id,
                uid=-1,
                request=request,
                failures=failures,
                cached_tokens=0,
                sampler=make_request_sampler(request.sampling, failures),
                processors=make_request_processors(
                    request.sampling, request.logits_processors, len(prompt), failures
                ),
                stop_ids=(frozenset() if request.ignore_eos else self._eos)
                | request.stop_token_ids,
            )
            hit = self._fetch_prefix(request, prompt)
            if solo:
                self._start_solo(sequence, prompt, hit)
                return
            try:
                uid = self._insert(
                    sequence,
                    prompt[hit.cached_tokens :] if hit else prompt,
                    hit.cache if hit else None,
                    prompt[: hit.cached_tokens] if hit else [],
                    request.max_tokens,
                )
            except Exception:  # a cached state that will not merge: prefill afresh
                if hit is None:
                    raise
                assert self._cache is not None
                self._cache.record_failure()
                hit = None
                uid = self._insert(sequence, prompt, None, [], request.max_tokens)
        except Exception:  # fails this request only
            log.exception("could not admit sequence %d", command.seq_id)
            self._finish_unstarted(command, "error", "the engine could not start this request")
            return
        sequence.cached_tokens = hit.cached_tokens if hit else 0
        self._track(sequence, uid)

    def _start_solo(self, sequence: _Sequence, prompt: list[int], hit: CacheHit | None) -> None:
        assert self._model is not None
        sequence.cached_tokens = hit.cached_tokens if hit else 0
        # Solo uids are negative: they never collide with BatchGenerator's.
        sequence.solo = SoloSequence(
            self._model.model,
            -(sequence.seq_id + 1),
            prompt,
            cache=hit.cache if hit else None,
            cached_tokens=sequence.cached_tokens,
            sampler=sequence.sampler,
            processors=sequence.processors,
            max_tokens=sequence.request.max_tokens,
            stop_tokens=sequence.stop_ids,
            prefill_step_size=self._config.prefill_step_size,
            before_launch=self._flush,
        )
        self._solo = sequence
        self._track(sequence, sequence.solo.uid)

    def _hand_over_solo(self) -> None:
        """Move the lone sequence into the batch, KV cache and in-flight token included.
        A failure here (reading the token in flight, inserting the cache) fails it alone."""
        sequence = self._solo
        assert sequence is not None and sequence.solo is not None
        solo = sequence.solo
        self._solo = None
        self._handovers += 1
        try:
            handover = solo.handover()
            if handover.response is not None:
                self._emit_token(sequence, handover.response)
                if handover.response.finish_reason is not None:
                    return  # it ended on the token that was in flight
            sequence.solo = None
            self._active.pop(solo.uid, None)
            uid = self._insert(
                sequence,
                handover.remaining_prompt,
                handover.cache,
                handover.cache_tokens,
                handover.max_tokens,
            )
        except Exception:  # fails this request only, as a failed admission does
            log.exception("could not move sequence %d into the batch", sequence.seq_id)
            self._end_suspect(sequence, "error", "the engine could not continue this request")
            return
        self._track(sequence, uid)

    def _track(self, sequence: _Sequence, uid: int) -> None:
        sequence.newcomer = True
        sequence.uid = uid
        self._active[uid] = sequence
        self._uids[sequence.seq_id] = uid

    def _fetch_prefix(self, request: GenerationRequest, prompt: list[int]) -> CacheHit | None:
        if self._cache is None:
            return None
        hit = self._cache.fetch(self._namespace(request), prompt)
        if hit is not None and not all(
            getattr(c, "offset", hit.cached_tokens) == hit.cached_tokens for c in hit.cache
        ):
            self._cache.record_failure()  # stale or mismatched state: prefill from scratch
            return None
        return hit

    def _insert(
        self,
        sequence: _Sequence,
        prompt: list[int],
        cache: list[Any] | None,
        cache_tokens: list[int],
        max_tokens: int,
    ) -> int:
        """Queue the sequence in the batch (`prompt` is what the cache does not hold yet)."""
        assert self._generator is not None
        (uid,) = self._generator.insert(
            [prompt],
            max_tokens=[max_tokens],
            caches=[cache] if cache is not None else None,
            all_tokens=[cache_tokens],
            samplers=[sequence.sampler],
            logits_processors=[sequence.processors],
            stop_sequences=[StopSequences([[t] for t in sorted(sequence.stop_ids)])],
        )
        return int(uid)

    def _namespace(self, request: GenerationRequest) -> tuple[str, str | None]:
        assert self._model is not None
        return (str(self._model.path), request.cache_key)

    # -- stepping ----------------------------------------------------------------------------
    def _step(self) -> None:
        """One decode step (or prefill chunk) for every active sequence.

        A step's responses hold MLX arrays (logprobs, slices of the batch). They are
        released after the *next* step has run, as a `generate_step` loop releases them,
        not while it is in flight: on MLX's CUDA backend, releasing them in between cost
        a lone 8B stream about a fifth of its speed (98.6 vs 123.4 tok/s on an H100,
        bench/single_stream_probe.py, "responses kept").
        """
        assert self._generator is not None
        try:
            responses = self._solo_step() if self._solo is not None else self._generator.next()[1]
        except Exception as exc:  # noqa: BLE001 - attributed, if at all, by _recover
            self._recover(exc)
            return
        self._previous_responses = responses
        self.steps += 1
        self._failures_in_a_row = 0
        for response in responses:
            sequence = self._active.get(response.uid)
            if sequence is not None:
                sequence.newcomer = False
                self._emit_checked(sequence, response)
        # The step returns token k while it computes token k+1 (pipelined), so a processor
        # failure recorded now concerns a token nobody has seen: emit k, never k+1.
        for sequence in [s for s in self._active.values() if s.failures]:
            reason = repr(sequence.failures[0])[:_MAX_REASON_CHARS]  # may quote a whole grammar
            log.warning(
                "logits processor or sampler failed for sequence %d: %s", sequence.seq_id, reason
            )
            self._remove(sequence.uid, "error", f"sampling failed: {reason}")

    def _solo_step(self) -> list[Any]:
        assert self._solo is not None and self._solo.solo is not None
        solo = self._solo.solo
        before = solo.prefilled
        response = solo.step()
        self._prompt_tokens += solo.prefilled - before
        self._solo_steps += 1
        return [] if response is None else [response]

    def _emit_checked(self, sequence: _Sequence, response: Any) -> None:
        """`_emit_token`, failing this sequence alone if its token or logprobs are unusable."""
        try:
            vocabulary = response.logprobs.shape[-1]
            if not 0 <= int(response.token) < vocabulary:
                raise ValueError(f"sampled token {int(response.token)} is outside the vocabulary")
            self._emit_token(sequence, response)
        except Exception as exc:  # noqa: BLE001 - isolated per request by design
            log.warning("could not emit a token of sequence %d: %r", sequence.seq_id, exc)
            if sequence.uid in self._active:
                self._remove(
                    sequence.uid, "error", "the engine could not read this request's token"
                )

    def _emit_token(self, sequence: _Sequence, response: Any) -> None:
        logprob = (
            self._logprob(sequence, response) if sequence.request.logprobs is not None else None
        )
        sequence.generated += 1
        sequence.tokens.append(int(response.token))
        self._generated_tokens += 1
        reason: FinishReason | None = response.finish_reason
        token = None if reason == "stop" else int(response.token)  # a stop token is never shown
        if reason is None:
            self._events.append((sequence.seq_id, StepEvent(token, logprob)))
            return
        self._events.append((sequence.seq_id, StepEvent(token, logprob, reason, sequence.usage())))
        self._to_store.append((sequence, response.prompt_cache, response.all_tokens))
        self._forget(sequence)

    @staticmethod
    def _logprob(sequence: _Sequence, response: Any) -> TokenLogprob:
        logprobs = response.logprobs
        k = min(sequence.request.logprobs or 0, logprobs.shape[-1])
        top: tuple[tuple[int, float], ...] = ()
        if k:
            ids = mx.argpartition(-logprobs, kth=k - 1)[:k]
            values = logprobs[ids]
            id_list: list[int] = ids.tolist()  # type: ignore[assignment]
            value_list: list[float] = values.tolist()
            pairs = sorted(zip(id_list, value_list, strict=True), key=lambda p: -p[1])
            top = tuple((int(i), float(val)) for i, val in pairs)
        return TokenLogprob(int(response.token), float(logprobs[response.token].item()), top)

    # -- failed steps ------------------------------------------------------------------------
    def _recover(self, exc: Exception) -> None:
        """A step (or a detach) raised: find the sequence responsible instead of failing all.

        The batch's state cannot be trusted after an exception inside a step, so the
        generator is replaced and its sequences are replayed: their prompt and the tokens
        they have posted are prefilled again and their samplers rewound, so they go on with
        the tokens they would have had. The suspects are the sequences inserted since their
        last token (newcomers). Suspects wait on probation while the others are replayed
        at once, then are replayed one at a time, each the one newcomer in its batch; with
        no suspect at all, everyone is. A sequence that is the one suspect of two failures
        (retried without the others in between) is failed alone, provided the model still
        computes without it (a one-token forward on a fresh cache); otherwise the failure
        is the engine's. The engine fails after `max_consecutive_step_failures` failures in
        a row that no suspect explains.
        """
        self._failed_steps += 1
        self._previous_responses = []
        batch = list(self._active.values())
        suspects = batch if self._solo is not None else [s for s in batch if s.newcomer]
        log.error(
            "a step failed with %d sequences (%d suspects): %r", len(batch), len(suspects), exc
        )
        self._retire_generator()
        self._generator = self._new_generator()
        for sequence in batch:  # all on probation first: whatever happens next, each is tracked
            self._active.pop(sequence.uid, None)
            self._uids.pop(sequence.seq_id, None)
            sequence.solo = None
            self._probation[sequence.seq_id] = sequence
        self._solo = None
        if len(suspects) == 1:
            suspect = suspects[0]
            suspect.strikes += 1
            if suspect.strikes >= _STRIKES_TO_BLAME:
                self._probation.pop(suspect.seq_id)
                if self._model_computes():
                    self._isolated_failures += 1
                    self._end_suspect(suspect, "error", "the engine could not compute this request")
                else:
                    self._end_suspect(
                        suspect, "error", "the engine failed while serving this request"
                    )
                    self._count_unexplained(exc)
        elif not suspects:
            self._count_unexplained(exc)
            return  # all wait on probation
        for sequence in batch:
            if sequence.seq_id in self._probation and sequence not in suspects:
                self._replay(self._probation.pop(sequence.seq_id))

    def _count_unexplained(self, exc: Exception) -> None:
        self._failures_in_a_row += 1
        if self._failures_in_a_row >= self._config.max_consecutive_step_failures:
            raise FatalEngineError("batch steps keep failing") from exc

    def _model_computes(self) -> bool:
        """Whether the model still runs a one-token forward on a fresh cache (after a failed
        step: if it does not, the failure was not the suspect's)."""
        assert self._model is not None
        try:
            with mx.stream(generation_stream):
                logits = self._model.model(
                    mx.array([[0]], dtype=mx.uint32), cache=make_prompt_cache(self._model.model)
                )
                mx.eval(logits)
        except Exception:  # the answer is "no"
            log.exception("the model fails on its own")
            return False
        return True

    def _replay_next_suspect(self) -> None:
        """Replay the next sequence on probation once no newcomer is in the batch."""
        if any(s.newcomer for s in self._active.values()):
            return
        seq_id = next(iter(self._probation))
        if self._solo is not None:
            self._hand_over_solo()
        self._replay(self._probation.pop(seq_id))

    def _replay(self, sequence: _Sequence) -> None:
        """Insert `sequence` into the batch afresh: its prompt and posted tokens are prefilled
        again; its sampler's next draw is its next token's."""
        self._replays += 1
        rewind_sampler(sequence.sampler, len(sequence.tokens))
        prompt = [*sequence.request.prompt_tokens, *sequence.tokens]
        try:
            uid = self._insert(
                sequence, prompt, None, [], sequence.request.max_tokens - sequence.generated
            )
        except Exception:  # fails this request only
            log.exception("could not replay sequence %d", sequence.seq_id)
            self._end_suspect(sequence, "error", "the engine could not continue this request")
            return
        self._track(sequence, uid)

    def _end_suspect(
        self, sequence: _Sequence, reason: FinishReason, error: str | None = None
    ) -> None:
        """End a sequence that is in no batch (on probation, or taken out of a failed one)."""
        self._events.append(
            (sequence.seq_id, StepEvent(None, None, reason, sequence.usage(), error))
        )
        self._forget(sequence)

    # -- leaving the batch -------------------------------------------------------------------
    def _remove(self, uid: int, reason: FinishReason, error: str | None = None) -> None:
        """End a sequence now: no step is launched for it after this.

        Its final event (the confirmation) goes out with the next flush, before the
        sequence is detached from the batch: detaching waits for the step in flight to
        land (mlx-lm's batch filter reads values back from the device), and the caller
        need not wait for a step whose tokens nobody will see. The step in flight was
        launched before the cancel arrived; `_detach_removed` runs before any later step.
        """
        sequence = self._active[uid]
        self._detaching.append((sequence, sequence.solo))
        self._events.append(
            (sequence.seq_id, StepEvent(None, None, reason, sequence.usage(), error))
        )
        self._forget(sequence)

    def _detach_removed(self) -> None:
        """Take ended sequences out of the batch (or off the fast path), keeping their KV state.

        Their confirmations were just posted. Detaching first runs a millisecond or two of
        Python (slicing every layer's KV) holding the GIL, which the receiving thread needs
        to take a confirmation: on an H100 that made a cancel's tail (p99 2.1-3.4 ms from
        the cancel applied to its confirmation received, against 0.4-0.5 ms p50). So the
        caller gets a short head start; the step in flight keeps the device busy meanwhile.
        It ends when the caller has seen the end, not when the delivery was handled: the
        caller's task runs a scheduler pass later, and a detach that took the GIL in between
        held it back for up to 8 ms (p99 3.7 ms on an H100).
        """
        self._confirmation_seen.wait(_CONFIRMATION_HEADSTART_SECONDS)
        detaching, self._detaching = self._detaching, []
        # One removal for all of them: each call filters every layer's KV of the whole batch.
        in_batch = [sequence.uid for sequence, solo in detaching if solo is None]
        caches: dict[int, Any] = {}
        if in_batch:
            assert self._generator is not None
            try:
                caches = self._generator.remove(
                    in_batch, return_prompt_caches=self._cache is not None
                )
            except Exception as exc:  # noqa: BLE001 - the batch is suspect, as after a failed step
                self._recover(exc)
                return
        for sequence, solo in detaching:
            cache, tokens = (
                solo.cancel() if solo is not None else caches.get(sequence.uid, (None, None))
            )
            if not sequence.failures:
                self._to_store.append((sequence, cache, tokens))

    def _store_finished(self) -> None:
        """Keep the KV state of the sequences ended so far in the prefix cache."""
        to_store, self._to_store = self._to_store, []
        for sequence, cache, tokens in to_store:
            if self._cache is None or not cache or not tokens:
                continue
            try:
                self._cache.insert(self._namespace(sequence.request), list(tokens), list(cache))
            except Exception:  # caching is an optimisation, never a failure
                log.exception("could not store a prefix-cache entry")

    def _forget(self, sequence: _Sequence) -> None:
        if sequence is self._solo:
            self._solo = None
        sequence.solo = None
        if self._active.get(sequence.uid) is sequence:  # a replayed one's old uid may be reused
            del self._active[sequence.uid]
        self._uids.pop(sequence.seq_id, None)
        self._finished.append(sequence.seq_id)

    def _finish_unstarted(
        self, command: Submit, reason: FinishReason, error: str | None = None
    ) -> None:
        usage = Usage(len(command.request.prompt_tokens), 0, 0)
        self._events.append((command.seq_id, StepEvent(None, None, reason, usage, error)))
        self._finished.append(command.seq_id)

    def _finish_active(self, reason: FinishReason, exc: BaseException | None) -> None:
        error = "the engine failed while serving this request" if exc is not None else None
        probation, self._probation = list(self._probation.values()), {}
        for sequence in [*self._active.values(), *probation]:
            self._events.append(
                (sequence.seq_id, StepEvent(None, None, reason, sequence.usage(), error))
            )
            self._forget(sequence)

    def _finish_all(self, reason: FinishReason, exc: BaseException | None) -> None:
        """On exit: finish the batch and every submission still queued; nobody waits forever."""
        self._finish_active(reason, exc)
        error = "the engine stopped before serving this request" if exc is not None else None
        held, self._held = self._held, []
        for command in [*held, *self._take_commands(block=False)]:
            if isinstance(command, Submit):
                self._finish_unstarted(command, reason, error)

    def _flush_step(self) -> None:
        """Post what the loop has so far, unless the lone sequence's next launch will
        (`_post_at_launch`): only token events then, since anything finished goes out now."""
        solo = self._solo.solo if self._solo is not None else None
        deferred = solo is not None and solo.token_in_flight and not self._finished
        if self._post_at_launch and deferred:
            return
        self._flush()

    def _flush(
        self, *, force: bool = False, closing: Literal["closed", "failed"] | None = None
    ) -> None:
        if not (self._events or self._finished or force or closing):
            return
        delivery = Delivery(self._events, self._finished, self._stats(), closing)
        if self._finished:
            self._confirmation_seen.clear()  # only confirmations are waited for
        self._events, self._finished = [], []
        self._post(delivery)

    def _stats(self) -> WorkerStats:
        # BatchGenerator counts prefilled tokens only in its private counters (mlx-lm 0.32.2).
        counters = getattr(self._generator, "_counters", None)
        prefilled = int(getattr(counters, "prompt_tokens", 0))
        return WorkerStats(
            steps=self.steps,
            active=len(self._active) + len(self._probation) + len(self._held),
            prompt_tokens_processed=self._prompt_tokens + prefilled,
            generated_tokens=self._generated_tokens,
            failed_steps=self._failed_steps,
            prefix_cache=self._cache.stats() if self._cache else None,
            solo_steps=self._solo_steps,
            handovers=self._handovers,
            isolated_failures=self._isolated_failures,
            replays=self._replays,
        )

    def _retire_generator(self) -> None:
        # Sequences still to detach from this generator go with it.
        self._detaching = [(seq, solo) for seq, solo in self._detaching if solo is not None]
        if self._generator is not None:
            self._prompt_tokens += int(
                getattr(getattr(self._generator, "_counters", None), "prompt_tokens", 0)
            )
            self._generator.close()
        self._generator = None

    def _release_memory(self) -> None:
        if self._cache is not None:
            self._cache.clear()
        self._retire_generator()
        self._detaching = []  # synchronize() below lands their steps in flight
        self._to_store = []
        self._model = None
        # The batch pipelines one step ahead: finish that work on this thread's stream
        # before the thread (and its stream) goes away.
        mx.synchronize()
        mx.clear_cache()
        # MLX requires every thread that made streams to destroy them before it ends;
        # otherwise the process can abort at exit (ml-explore/mlx#4327).
        mx.clear_streams()
