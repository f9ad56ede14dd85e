"""The engine thread: the only thread that touches MLX for the engine's whole life.

It loads the model, then runs `Worker`'s loop until told to stop. It knows nothing of
Trio: commands arrive on a thread-safe queue, and everything leaves through the `Outbox`.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from ..models import LoadedModel, load_model
from ._config import EngineConfig
from ._detokenizer import TokenBytes
from ._ledger import Ledger
from ._messages import Cancel, Command, Delivery, ModelInfo, StepEvent, Stop, Submit, WorkerStats
from ._outbox import Outbox
from ._prefix_cache import CacheHit, PrefixCache
from ._recovery import judge, model_computes
from ._sampling import rewind_sampler
from ._sequence import LiveSequence, Response, build_sequence, token_logprob
from ._solo import SoloStepper
from ._stepper import BatchStepper, Start, Stepper
from ._types import FinishReason

log = logging.getLogger("mlx_nursery.engine")

_IDLE_POLL_SECONDS = 1.0
_MAX_REASON_CHARS = 500
"""Of an exception's text kept in logs and error events (a grammar's may quote all of it)."""


class FatalEngineError(RuntimeError):
    """The engine cannot continue (repeated batch failures, or a bug in the loop)."""


class Worker:
    """The engine thread's state machine.

    Each iteration of the loop, in this order:
      1. take the commands that arrived (blocking only while nothing runs);
      2. apply them: cancels first (the sequence ends: its final event and confirmation go
         to the outbox, and it is marked detaching), then submissions (held while a failed
         step's sequences are on probation; cancelled if a stop came with them; else
         settled past the cancels, then admitted);
      3. settle: post what is due, then detach what ended from its stepper, then keep its
         KV state in the prefix cache;
      4. replay the next sequence on probation, or admit the held submissions;
      5. run one step of the stepper and emit each sequence's token; end the sequences
         whose sampler or logits processors failed in it;
      6. now and then, expire prefix-cache entries;
      7. settle again.

    The rules (where each sequence may be: `_ledger`):
      - a final event carries the confirmation: the outbox posts both in one delivery;
      - the confirmation is posted before the sequence is detached (settle posts first), so
        a caller never waits on a detach or on a step whose tokens nobody will see;
      - an ended sequence is detached before any later command applies and before any later
        step, so a lane its confirmation freed is never used twice;
      - the prefix cache stores a sequence after its final event is posted (settle stores
        last), so no final event waits for a store;
      - one stepper holds the active sequences: the fast path's while a lone sequence runs,
        else the batch's (the other holds none once settled).
    `Ledger.check` asserts these after every iteration when `EngineConfig.check_invariants`
    is on (the test suite runs with it on).

    Anything that can fail for one request is guarded per request: building its sampler and
    processors, fetching its cached prefix, inserting it, the handover, reading its token.
    A step that fails where no guard sees is attributed by replay (`_recovery`).
    """

    _batch: BatchStepper
    _solo: SoloStepper
    _stepper: Stepper
    _model: LoadedModel

    def __init__(
        self,
        config: EngineConfig,
        post: Callable[[Delivery], None],
        on_ready: Callable[[ModelInfo | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        self._config = config
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._outbox = Outbox(post, self._stats)
        self._ledger = Ledger(self._outbox, checking=config.check_invariants)
        self._cache: PrefixCache | None = None
        self._eos: frozenset[int] = frozenset()
        self._previous_responses: list[Response] = []
        """The last step's responses (MLX arrays), released only once the next step has run,
        as a `generate_step` loop releases them: releasing them while the next step is in
        flight cost a lone stream markedly on CUDA (docs/architecture.md)."""
        self.steps = 0  # read from Trio for cancellation accounting (an int: atomic under the GIL)
        self._retired_prefill = 0
        self._generated_tokens = 0
        self._failed_steps = 0
        self._failures_in_a_row = 0
        self._solo_steps = 0
        self._handovers = 0
        self._isolated_failures = 0
        self._replays = 0

    # -- called from any thread -------------------------------------------------------------
    def submit(self, seq_id: int, request: Any) -> None:
        self._commands.put(Submit(seq_id, request))

    def cancel(self, seq_id: int) -> None:
        self._commands.put(Cancel(seq_id))

    def stop(self) -> None:
        self._commands.put(Stop())

    def confirmation_seen(self) -> None:
        """The receiving side calls this once a caller has seen a sequence's end; see
        `Outbox.wait_for_caller`."""
        self._outbox.caller_saw_end()

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
            self._batch = self._new_batch()
            self._solo = SoloStepper(
                self._model.model,
                prefill_step_size=self._config.prefill_step_size,
                before_launch=self._outbox.post_at_launch,
            )
            self._stepper = self._batch
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
            self._outbox.post(closing="failed" if reason else "closed")
            self._release_memory()
            self._on_exit(reason)

    def _model_info(self) -> ModelInfo:
        return ModelInfo(
            path=str(self._model.path),
            tokenizer=self._model.tokenizer,
            context_length=self._model.context_length,
            eos_token_ids=self._eos,
            token_bytes=TokenBytes(self._model.tokenizer),
        )

    def _new_batch(self) -> BatchStepper:
        return BatchStepper(
            self._model.model,
            max_concurrency=self._config.max_concurrency,
            prefill_batch_size=self._config.prefill_batch_size,
            prefill_step_size=self._config.prefill_step_size,
        )

    def _loop(self) -> None:
        next_expiry_check = time.monotonic()
        while True:
            if not self._ledger.active:
                self._previous_responses = []  # no next step: nothing to wait for
            idle = not (self._ledger.active or self._ledger.probation or self._ledger.held)
            if self._apply(self._take_commands(block=idle)):
                return
            self._settle()
            if self._ledger.probation:
                self._replay_next_suspect()
            elif self._ledger.held:
                held, self._ledger.held = self._ledger.held, []
                self._admit_all(held)
            if self._ledger.active:
                self._step()
            if self._cache is not None and time.monotonic() >= next_expiry_check:
                next_expiry_check = time.monotonic() + min(_IDLE_POLL_SECONDS, self._cache.ttl)
                if self._cache.evict_expired():
                    self._outbox.post(force=True)
            self._settle()  # again for those the step ended
            if self._config.check_invariants:
                unused = self._batch if self._stepper is self._solo else self._solo
                self._ledger.check(self._stepper, unused)

    def _settle(self) -> None:
        """Post what is due, then detach and store what ended. Called twice per token, so
        the common case (nothing ended) is a few checks: a lone stream's tokens are bound by
        this thread's Python."""
        self._outbox.post_due(token_in_flight=self._stepper.token_in_flight)
        if self._ledger.detaching:
            self._detach()
            self._outbox.post_due(token_in_flight=False)  # a failed detach may end some
        if self._ledger.to_store:
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
            uid = self._ledger.uids.get(seq_id)
            if uid is not None:
                self._ledger.remove(uid, self._stepper, "cancelled")
            elif seq_id in self._ledger.probation:
                sequence = self._ledger.probation.pop(seq_id)
                self._ledger.finish(sequence, sequence.final("cancelled"))
        for held in [c for c in self._ledger.held if c.seq_id in cancelled]:
            self._ledger.held.remove(held)
            self._ledger.end_unstarted(held, "cancelled")
        admitted: list[Submit] = []
        for command in commands:
            if isinstance(command, Submit):
                if stop or command.seq_id in cancelled:
                    self._ledger.end_unstarted(command, "cancelled")
                else:
                    admitted.append(command)
        if admitted and self._ledger.probation:
            self._ledger.held += admitted
        elif admitted:
            self._settle()  # what the cancels ended leaves its stepper before anyone enters
            self._admit_all(admitted)
        return stop

    # -- admission ---------------------------------------------------------------------------
    def _admit_all(self, commands: list[Submit]) -> None:
        """A lone sequence takes the fast path; any company moves everyone into the batch."""
        lone = not (self._ledger.active or self._ledger.probation) and len(commands) == 1
        if lone and self._config.single_sequence_fast_path:
            self._admit(commands[0], self._solo)
            return
        self._hand_over()
        for command in commands:
            self._admit(command, self._batch)

    def _admit(self, command: Submit, stepper: Stepper) -> None:
        """Start one sequence in `stepper`. Anything that fails here fails this request alone."""
        try:
            sequence = build_sequence(command, self._eos)
            prompt = list(command.request.prompt_tokens)
            hit = self._fetch_prefix(sequence, prompt)
            fresh = Start(prompt, None, [], command.request.max_tokens)
            if hit is None:
                uid = stepper.insert(sequence, fresh)
            else:
                cached = hit.cached_tokens
                start = Start(prompt[cached:], hit.cache, prompt[:cached], fresh.max_tokens)
                try:
                    uid = stepper.insert(sequence, start)
                    sequence.cached_tokens = cached
                except Exception:  # noqa: BLE001 - a cached state that will not merge: prefill afresh
                    assert self._cache is not None
                    self._cache.record_failure()
                    uid = stepper.insert(sequence, fresh)
        except Exception:  # fails this request only
            log.exception("could not admit sequence %d", command.seq_id)
            self._ledger.end_unstarted(command, "error", _COULD_NOT_START)
            return
        self._stepper = stepper
        self._ledger.track(sequence, uid)

    def _hand_over(self) -> None:
        """Swap the fast path for the batch; its lone sequence moves along, KV cache and
        in-flight token included. A failure here fails that sequence alone."""
        self._stepper = self._batch
        if not self._solo.uids:
            return
        (uid,) = self._solo.uids
        sequence = self._ledger.active[uid]
        self._handovers += 1
        try:
            taken = self._solo.handover()
            assert taken is not None
            handover = taken[1]
            if handover.response is not None:
                self._emit_token(sequence, handover.response)
                if handover.response.finish_reason is not None:
                    return  # it ended on the token that was in flight
            self._ledger.forget(sequence)
            new_uid = self._batch.insert(sequence, handover.start)
        except Exception:  # fails this request only, as a failed admission does
            log.exception("could not move sequence %d into the batch", sequence.seq_id)
            self._ledger.finish(sequence, sequence.final("error", _COULD_NOT_CONTINUE))
            return
        self._ledger.track(sequence, new_uid)

    def _fetch_prefix(self, sequence: LiveSequence, prompt: list[int]) -> CacheHit | None:
        if self._cache is None:
            return None
        namespace = (str(self._model.path), sequence.request.cache_key)
        hit = self._cache.fetch(namespace, prompt)
        if hit is not None and not all(
            getattr(c, "offset", hit.cached_tokens) == hit.cached_tokens for c in hit.cache
        ):
            self._cache.record_failure()  # stale or mismatched state: prefill from scratch
            return None
        return hit

    # -- stepping ----------------------------------------------------------------------------
    def _step(self) -> None:
        """One decode step (or prefill chunk) for every active sequence."""
        stepper = self._stepper
        try:
            responses = stepper.step()
        except Exception as exc:  # noqa: BLE001 - attributed, if at all, by _recover
            self._recover(exc)
            return
        self._previous_responses = responses
        self.steps += 1
        self._solo_steps += stepper.kind == "solo"
        self._failures_in_a_row = 0
        for response in responses:
            sequence = self._ledger.active.get(response.uid)
            if sequence is not None:
                sequence.newcomer = False
                self._emit_checked(sequence, response)
        # The step returns token k while it computes token k+1 (pipelined), so a processor
        # failure recorded now concerns a token nobody has seen: emit k, never k+1.
        for sequence in [s for s in self._ledger.active.values() if s.failures]:
            reason = repr(sequence.failures[0])[:_MAX_REASON_CHARS]  # may quote a whole grammar
            log.warning(
                "logits processor or sampler failed for sequence %d: %s", sequence.seq_id, reason
            )
            self._ledger.remove(sequence.uid, self._stepper, "error", f"sampling failed: {reason}")

    def _emit_checked(self, sequence: LiveSequence, response: Response) -> None:
        """`_emit_token`, failing this sequence alone if its token or logprobs are unusable."""
        try:
            vocabulary = response.logprobs.shape[-1]
            if not 0 <= int(response.token) < vocabulary:
                raise ValueError(f"sampled token {int(response.token)} is outside the vocabulary")
            self._emit_token(sequence, response)
        except Exception as exc:  # noqa: BLE001 - isolated per request by design
            log.warning("could not emit a token of sequence %d: %r", sequence.seq_id, exc)
            if sequence.uid in self._ledger.active:
                self._ledger.remove(
                    sequence.uid,
                    self._stepper,
                    "error",
                    "the engine could not read this request's token",
                )

    def _emit_token(self, sequence: LiveSequence, response: Response) -> None:
        logprob = (
            token_logprob(sequence, response) if sequence.request.logprobs is not None else None
        )
        sequence.generated += 1
        sequence.tokens.append(int(response.token))
        self._generated_tokens += 1
        reason: FinishReason | None = response.finish_reason
        token = None if reason == "stop" else int(response.token)  # a stop token is never shown
        if reason is None:
            self._outbox.token(sequence.seq_id, StepEvent(token, logprob))
            return
        self._ledger.finish(sequence, StepEvent(token, logprob, reason, sequence.usage()))
        self._ledger.to_store.append((sequence, (response.prompt_cache, response.all_tokens)))

    # -- failed steps (see _recovery) ----------------------------------------------------------
    def _recover(self, exc: Exception) -> None:
        """A step (or a detach) raised: replace the batch, replay its sequences, and fail
        alone the one that `judge` blames, if the model still computes without it."""
        self._failed_steps += 1
        self._previous_responses = []
        failed = list(self._ledger.active.values())
        verdict = judge(failed, solo=self._stepper.kind == "solo")
        log.error("a step failed with %d sequences: %r", len(failed), exc)
        self._retire_batch()
        self._batch = self._new_batch()
        self._solo.close()
        self._stepper = self._batch
        for sequence in failed:  # all on probation first: whatever happens next, each is tracked
            self._ledger.forget(sequence)
            self._ledger.probation[sequence.seq_id] = sequence
        if verdict.blamed is not None:
            blamed = self._ledger.probation.pop(verdict.blamed.seq_id)
            if model_computes(self._model.model):
                self._isolated_failures += 1
                self._ledger.finish(
                    blamed, blamed.final("error", "the engine could not compute this request")
                )
            else:
                self._ledger.finish(blamed, blamed.final("error", _FAILED_WHILE_SERVING))
                self._count_unexplained(exc)
        if verdict.unexplained:
            self._count_unexplained(exc)
        for sequence in verdict.replay_now:
            self._replay(self._ledger.probation.pop(sequence.seq_id))

    def _count_unexplained(self, exc: Exception) -> None:
        self._failures_in_a_row += 1
        if self._failures_in_a_row >= self._config.max_consecutive_step_failures:
            raise FatalEngineError("batch steps keep failing") from exc

    def _replay_next_suspect(self) -> None:
        """Replay the next sequence on probation once no newcomer is in the batch."""
        if any(s.newcomer for s in self._ledger.active.values()):
            return
        self._hand_over()
        self._replay(self._ledger.probation.pop(next(iter(self._ledger.probation))))

    def _replay(self, sequence: LiveSequence) -> None:
        """Insert `sequence` into the batch afresh: its prompt and posted tokens are prefilled
        again; its sampler's next draw is its next token's."""
        self._replays += 1
        rewind_sampler(sequence.sampler, len(sequence.tokens))
        prompt = [*sequence.request.prompt_tokens, *sequence.tokens]
        remaining = sequence.request.max_tokens - sequence.generated
        try:
            uid = self._batch.insert(sequence, Start(prompt, None, [], remaining))
        except Exception:  # fails this request only
            log.exception("could not replay sequence %d", sequence.seq_id)
            self._ledger.finish(sequence, sequence.final("error", _COULD_NOT_CONTINUE))
            return
        self._ledger.track(sequence, uid)

    # -- leaving -----------------------------------------------------------------------------
    def _detach(self) -> None:
        """Take ended sequences out of their stepper, keeping their KV state (one removal per
        stepper: each filters every layer's KV of the whole batch)."""
        self._outbox.wait_for_caller()
        detaching, self._ledger.detaching = self._ledger.detaching, []
        steppers = {id(stepper): stepper for _, stepper in detaching}
        for stepper in steppers.values():
            ended = [sequence for sequence, s in detaching if s is stepper]
            try:
                states = stepper.remove(
                    [sequence.uid for sequence in ended], keep_state=self._cache is not None
                )
            except Exception as exc:  # noqa: BLE001 - the batch is suspect, as after a failed step
                self._recover(exc)
                return
            for sequence in ended:
                if not sequence.failures:
                    self._ledger.to_store.append((sequence, states.get(sequence.uid, (None, None))))

    def _store_finished(self) -> None:
        """Keep the KV state of the sequences ended so far in the prefix cache."""
        to_store, self._ledger.to_store = self._ledger.to_store, []
        for sequence, (cache, tokens) in to_store:
            if self._cache is None or not cache or not tokens:
                continue
            namespace = (str(self._model.path), sequence.request.cache_key)
            try:
                self._cache.insert(namespace, list(tokens), list(cache))
            except Exception:  # caching is an optimisation, never a failure
                log.exception("could not store a prefix-cache entry")

    def _finish_all(self, reason: FinishReason, exc: BaseException | None) -> None:
        """On exit: end every sequence, running or queued; nobody waits forever."""
        error = _FAILED_WHILE_SERVING if exc is not None else None
        probation, self._ledger.probation = list(self._ledger.probation.values()), {}
        for sequence in [*self._ledger.active.values(), *probation]:
            self._ledger.finish(sequence, sequence.final(reason, error))
        error = "the engine stopped before serving this request" if exc is not None else None
        held, self._ledger.held = self._ledger.held, []
        for command in [*held, *self._take_commands(block=False)]:
            if isinstance(command, Submit):
                self._ledger.end_unstarted(command, reason, error)

    # -- bookkeeping -------------------------------------------------------------------------
    def _stats(self) -> WorkerStats:
        prefilled = self._retired_prefill + self._batch.prefilled + self._solo.prefilled
        return WorkerStats(
            steps=self.steps,
            active=self._ledger.running,
            prompt_tokens_processed=prefilled,
            generated_tokens=self._generated_tokens,
            failed_steps=self._failed_steps,
            prefix_cache=self._cache.stats() if self._cache else None,
            solo_steps=self._solo_steps,
            handovers=self._handovers,
            isolated_failures=self._isolated_failures,
            replays=self._replays,
        )

    def _retire_batch(self) -> None:
        """Close the batch stepper; sequences still to detach from it go with it."""
        self._ledger.detaching = [
            (s, stepper) for s, stepper in self._ledger.detaching if stepper is not self._batch
        ]
        self._retired_prefill += self._batch.prefilled
        self._batch.close()

    def _release_memory(self) -> None:
        if self._cache is not None:
            self._cache.clear()
        self._retire_batch()
        self._solo.close()
        self._ledger.detaching = []  # synchronize() below lands their steps in flight
        self._ledger.to_store = []
        self._previous_responses = []
        del self._model
        # The batch pipelines one step ahead: finish that work on this thread's stream
        # before the thread (and its stream) goes away.
        mx.synchronize()
        mx.clear_cache()
        # MLX requires every thread that made streams to destroy them before it ends;
        # otherwise the process can abort at exit (ml-explore/mlx#4327).
        mx.clear_streams()


_COULD_NOT_START = "the engine could not start this request"
_COULD_NOT_CONTINUE = "the engine could not continue this request"
_FAILED_WHILE_SERVING = "the engine failed while serving this request"
