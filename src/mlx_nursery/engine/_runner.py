"""Sequences on the steppers: admission, steps, the handover, failed steps, detaching.

The engine thread's `Worker` owns the thread, the commands and the loop; it drives a
`Runner` for everything that puts sequences into steppers and takes them out, keeping
the rules stated in the worker's docstring. Engine thread only.
"""

from __future__ import annotations

import logging
import time

from .. import fault_points
from ..models import LoadedModel
from ._chunking import ChunkSizer, budget_ms
from ._config import EngineConfig
from ._kv_quant import cache_factory
from ._ledger import Ledger
from ._memory import KV_STEP, KVBudget
from ._messages import StepEvent, Submit
from ._outbox import Outbox
from ._prefix_cache import CacheHit, PrefixCache
from ._recovery import judge, model_computes
from ._sampling import rewind_sampler
from ._scripted import ScriptedFault, ScriptedStepper
from ._sequence import LiveSequence, Response, build_sequence, token_logprob
from ._shapes import ShapeWatch
from ._solo import SoloStepper
from ._stepper import BatchStepper, Start, Stepper
from ._types import FinishReason, ImageInputs
from ._vision import ImagePrefill, cache_key, last_image_end

log = logging.getLogger("mlx_nursery.engine")

MAX_REASON_CHARS = 500
"""Of an exception's text kept in logs and error events (a grammar's may quote all of it)."""


_COULD_NOT_START = "the engine could not start this request"
_COULD_NOT_CONTINUE = "the engine could not continue this request"
_FAILED_WHILE_SERVING = "the engine failed while serving this request"


class FatalEngineError(RuntimeError):
    """The engine cannot continue (repeated batch failures, or a bug in the loop)."""


class Runner:
    """Runs the sequences of one loaded model on its two steppers, one at a time."""

    def __init__(
        self,
        config: EngineConfig,
        model: LoadedModel,
        cache: PrefixCache | None,
        outbox: Outbox,
        ledger: Ledger,
        budget: KVBudget,
    ) -> None:
        self._config = config
        self._budget = budget
        self._model = model
        self._cache = cache
        self._outbox = outbox
        self._ledger = ledger
        self._eos = frozenset(int(t) for t in model.tokenizer.eos_token_ids)
        self._scripted = model.kind == "scripted"
        """The scripted model: its stepper is the only one (no fast path, no handover)."""
        self._fast_path = config.single_sequence_fast_path and not self._scripted
        self._image_token = int(model.config["image_token_id"]) if model.vision else None
        """A vision model's image placeholder id (None: a text model)."""
        self.shapes = ShapeWatch(model.model)
        """The model as both steppers call it, counting the prefill shapes they run."""
        self._make_cache = cache_factory(config.kv_quantization)
        """Fresh KV caches, quantized if the config asks (engine/_kv_quant.py)."""
        self.chunks = ChunkSizer(config.prefill_step_size, budget_ms(config.prefill_chunk_ms))
        """Sizes the prefill chunks run beside decoding sequences (engine/_chunking.py)."""
        self._batch: Stepper = self._new_batch()
        self._solo = SoloStepper(
            self.shapes,
            prefill_step_size=config.prefill_step_size,
            before_launch=outbox.post_at_launch,
            make_cache=self._make_cache,
            chunk_timed=self.chunks.observe,
        )
        self._stepper: Stepper = self._batch
        self._previous_responses: list[Response] = []
        """The last step's responses (MLX arrays), released only once the next step has run,
        as a `generate_step` loop releases them: releasing them while the next step is in
        flight cost a lone stream markedly on CUDA (docs/architecture.md)."""
        self.steps = 0  # read from Trio for cancellation accounting (an int: atomic under the GIL)
        self.retired_prefill = 0
        self.generated_tokens = 0
        self.failed_steps = 0
        self._failures_in_a_row = 0
        self.solo_steps = 0
        self.handovers = 0
        self.isolated_failures = 0
        self.replays = 0
        self.preemptions = 0
        self.held_for_memory = 0

    @property
    def prefilled(self) -> int:
        return self.retired_prefill + self._batch.prefilled + self._solo.prefilled

    def cancel(self, seq_id: int) -> None:
        """End the sequence now, wherever it runs or waits (a no-op once it has ended)."""
        uid = self._ledger.uids.get(seq_id)
        if uid is not None:
            self._ledger.remove(uid, self._stepper, "cancelled")
            return
        ledger = self._ledger
        for waiting in (ledger.probation, ledger.preempted, ledger.imaging):
            if seq_id in waiting:  # held by no stepper
                sequence = waiting.pop(seq_id)
                sequence.prefill = None  # an image prefill's partial KV goes with it
                ledger.finish(sequence, sequence.final("cancelled"))
                return

    def release_idle_responses(self) -> None:
        if not self._ledger.active:
            self._previous_responses = []  # no next step: nothing to wait for

    def check(self) -> None:
        unused = self._batch if self._stepper is self._solo else self._solo
        self._ledger.check(self._stepper, unused)

    def close(self) -> None:
        self._retire_batch()
        self._solo.close()
        self._ledger.detaching = []
        self._ledger.to_store = []
        self._previous_responses = []

    def settle(self) -> None:
        """Post what is due, then detach and store what ended. Called twice per token, so
        the common case (nothing ended) is a few checks: a lone stream's tokens are bound by
        this thread's Python."""
        self._outbox.post_due(token_in_flight=self._stepper.token_in_flight)
        if self._ledger.detaching:
            self._detach()
            self._outbox.post_due(token_in_flight=False)  # a failed detach may end some
        if self._ledger.to_store:
            self._store_finished()

    def _new_batch(self) -> Stepper:
        if self._scripted:
            config = self._model.config
            return ScriptedStepper(int(config["vocab_size"]), int(config["eos_token_id"][0]))
        return BatchStepper(
            self.shapes,
            max_concurrency=self._config.max_concurrency,
            prefill_batch_size=self._config.prefill_batch_size,
            prefill_step_size=self._config.prefill_step_size,
            chunk_sizer=self.chunks,
            make_cache=self._make_cache if self._config.kv_bits is not None else None,
        )

    def admit_all(self, commands: list[Submit], *, arriving: bool = True) -> None:
        """A lone sequence takes the fast path; any company moves everyone into the batch.
        From the first that the KV budget cannot take with room to grow, the rest are held,
        in order (a preempted sequence waits before them: see `admit_waiting`)."""
        lengths = self._lengths()
        admitted: list[Submit] = []
        for i, command in enumerate(commands):
            lengths.append(len(command.request.prompt_tokens))
            if not self._budget.fits(lengths, growth=KV_STEP):
                self.hold(commands[i:], ahead=True, count=arriving)
                break
            admitted.append(command)
        if not admitted:
            return
        ledger = self._ledger
        lone = not (ledger.active or ledger.probation or ledger.preempted) and len(admitted) == 1
        if lone and self._fast_path:
            self._admit(admitted[0], self._solo)
            return
        self._hand_over()
        for command in admitted:
            self._admit(command, self._batch)

    def hold(self, commands: list[Submit], *, ahead: bool, count: bool) -> None:
        """Hold submissions back, in order: `ahead` of those held already (they were held
        first and came back), else behind them. `count`: they wait for KV memory
        (`held_for_memory`), not only behind sequences on probation."""
        held = self._ledger.held
        self._ledger.held = [*commands, *held] if ahead else [*held, *commands]
        self.held_for_memory += count * len(commands)

    def admit_waiting(self) -> None:
        """Replay the preempted sequences that fit again, oldest preemption first, then admit
        held submissions; nothing overtakes a sequence that does not fit yet."""
        lengths = self._lengths()
        while self._ledger.preempted:
            seq_id, sequence = next(iter(self._ledger.preempted.items()))
            length = len(sequence.request.prompt_tokens) + len(sequence.tokens)
            if not self._budget.fits([*lengths, length], growth=KV_STEP):
                return
            self._hand_over()
            del self._ledger.preempted[seq_id]
            self._replay(sequence, after_failure=False)
            lengths.append(length)
        held, self._ledger.held = self._ledger.held, []
        self.admit_all(held, arriving=False)

    def make_room(self) -> None:
        """Before a step: take the newest sequences out of the batch until the step's KV
        fits the budget; each waits as preempted and is replayed (its prompt and tokens so
        far prefilled again, its sampler rewound: the same tokens follow) when it fits."""
        active = self._ledger.active
        while len(active) > 1 and not self._budget.fits(self._lengths(), growth=1):
            victim = max(active.values(), key=lambda s: s.seq_id)
            try:
                self._stepper.remove([victim.uid], keep_state=False)
            except Exception as exc:  # noqa: BLE001 - the batch is suspect, as after a failed step
                self._recover(exc)
                return
            self._ledger.forget(victim)
            self._ledger.preempted[victim.seq_id] = victim
            self.preemptions += 1
            log.info("sequence %d preempted: the batch's KV would outgrow it", victim.seq_id)

    def _lengths(self) -> list[int]:
        """Tokens each active sequence's KV holds (or will, once its prompt is prefilled),
        image prompts being prefilled included."""
        running = [*self._ledger.active.values(), *self._ledger.imaging.values()]
        return [len(s.request.prompt_tokens) + len(s.tokens) for s in running]

    def prefill_images(self) -> None:
        """Chunks of the image prompts' prefills, oldest first, up to a text chunk's size in
        all (at least one chunk), as a text prefill chunk bounds an iteration: the sizer's
        (`prefill_step_size` unless sequences decode beside them and it shrinks it)."""
        size = self.chunks.size(1, decoding=bool(self._ledger.active))
        budget = size
        for seq_id in list(self._ledger.imaging):
            if budget <= 0:
                return
            budget -= self._prefill_image_chunk(seq_id, size)

    def _prefill_image_chunk(self, seq_id: int, size: int) -> int:
        """One chunk (up to `size` tokens) of this image prompt's prefill; once it is done,
        the sequence starts as a prefix-cache hit would (the fast path if alone, else the
        batch). A failure fails that request alone. Returns the tokens prefilled."""
        sequence = self._ledger.imaging[seq_id]
        prefill: ImagePrefill = sequence.prefill
        tokens = 0
        try:
            started = time.perf_counter()
            tokens = prefill.step(size)
            self.chunks.observe(tokens, time.perf_counter() - started)
            if not prefill.done:
                return tokens
            del self._ledger.imaging[seq_id]
            sequence.prefill = None
            prompt = prefill.prompt
            remaining = sequence.request.max_tokens - sequence.generated
            self._start(sequence, Start(prompt[-1:], prefill.cache, prompt[:-1], remaining))
        except Exception:  # fails this request only
            log.exception("could not prefill the images of sequence %d", seq_id)
            self._ledger.imaging.pop(seq_id, None)
            sequence.prefill = None
            self._ledger.finish(sequence, sequence.final("error", _COULD_NOT_START))
        return max(tokens, 1)

    def _start(self, sequence: LiveSequence, start: Start) -> None:
        """Put a sequence whose prompt is prefilled into a stepper (raises if it cannot)."""
        ledger = self._ledger
        lone = not (ledger.active or ledger.probation or ledger.preempted)
        if lone and self._fast_path:
            stepper: Stepper = self._solo
        else:
            self._hand_over()
            stepper = self._batch
        uid = stepper.insert(sequence, start)
        self._stepper = stepper
        ledger.track(sequence, uid)

    def _admit(self, command: Submit, stepper: Stepper) -> None:
        """Start one sequence in `stepper` (an image prompt: its prefill, unless a cached
        prefix covers every image). Anything that fails here fails this request alone."""
        try:
            sequence = build_sequence(command, self._eos)
            if fault_points.ARMED:
                fault_points.reach("admission", command.label)
            prompt = list(command.request.prompt_tokens)
            hit = self._fetch_prefix(sequence, self._cache_key(sequence, prompt))
            fresh = Start(prompt, None, [], command.request.max_tokens)
            uid = None
            if hit is not None and hit.cached_tokens >= self._images_end(prompt):
                cached = hit.cached_tokens
                start = Start(prompt[cached:], hit.cache, prompt[:cached], fresh.max_tokens)
                try:
                    uid = stepper.insert(sequence, start)
                    sequence.cached_tokens = cached
                except Exception:  # noqa: BLE001 - a cached state that will not merge: prefill afresh
                    assert self._cache is not None
                    self._cache.record_failure()
            if uid is None and command.request.images is not None:
                self._begin_image_prefill(sequence, prompt, command.request.images)
                self._report_admission(sequence)
                return
            if uid is None:
                uid = stepper.insert(sequence, fresh)
        except Exception:  # fails this request only
            log.exception("could not admit sequence %d", command.seq_id)
            self._ledger.end_unstarted(command, "error", _COULD_NOT_START)
            return
        self._stepper = stepper
        self._ledger.track(sequence, uid)
        self._report_admission(sequence)

    def _report_admission(self, sequence: LiveSequence) -> None:
        """The admission event of a request that asks for it (`report_admission`): its
        prompt's usage, its prefix cache read known, before any token."""
        if sequence.request.report_admission:
            self._outbox.token(sequence.seq_id, StepEvent(None, usage=sequence.usage()))

    def _hand_over(self) -> None:
        """Swap the fast path for the batch; its lone sequence moves along, KV cache and
        in-flight token included. A failure here fails that sequence alone."""
        self._stepper = self._batch
        if not self._solo.uids:
            return
        (uid,) = self._solo.uids
        sequence = self._ledger.active[uid]
        self.handovers += 1
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

    def _namespace(self, sequence: LiveSequence) -> tuple[str, str | None]:
        """Prefix-cache entries are shared only within a model and a request's cache key."""
        return (str(self._model.path), sequence.request.cache_key)

    def _begin_image_prefill(
        self, sequence: LiveSequence, prompt: list[int], images: ImageInputs
    ) -> None:
        """Encode the images (raises what the model raises) and queue the prompt's prefill,
        a chunk per iteration (`prefill_images`); the sequence starts once it is done."""
        sequence.prefill = ImagePrefill(self._model, prompt, images, self._make_cache)
        self._ledger.imaging[sequence.seq_id] = sequence

    def _cache_key(self, sequence: LiveSequence, tokens: list[int]) -> list[int] | None:
        """What the prefix cache knows `tokens` of this sequence by: the tokens, with an image
        prompt's placeholders named by their images (None: not cacheable)."""
        images = sequence.request.images
        if images is None or self._image_token is None:
            return tokens
        return cache_key(tokens, images, self._image_token)

    def _images_end(self, prompt: list[int]) -> int:
        """Where a prompt's images end: a cached prefix must reach it (0 for a text model)."""
        return 0 if self._image_token is None else last_image_end(prompt, self._image_token)

    def _fetch_prefix(self, sequence: LiveSequence, prompt: list[int] | None) -> CacheHit | None:
        if self._cache is None or prompt is None:
            return None
        if fault_points.ARMED:
            fault_points.reach("prefix_fetch", sequence.label)
        hit = self._cache.fetch(self._namespace(sequence), prompt)
        if hit is not None and not all(
            getattr(c, "offset", hit.cached_tokens) == hit.cached_tokens for c in hit.cache
        ):
            self._cache.record_failure()  # stale or mismatched state: prefill from scratch
            return None
        return hit

    def step(self) -> None:
        """One decode step (or prefill chunk) for every active sequence."""
        stepper = self._stepper
        try:
            if fault_points.ARMED:  # a test's fault in the step itself, as a forward would fail
                for live in self._ledger.active.values():
                    started = bool(live.tokens)  # a replay keeps its tokens: still decoding
                    point: fault_points.Point = "decode_step" if started else "prefill"
                    fault_points.reach(point, live.label)
            responses = stepper.step()
        except Exception as exc:  # noqa: BLE001 - attributed, if at all, by _recover
            self._recover(exc)
            return
        self._previous_responses = responses
        self.steps += 1
        self.solo_steps += stepper.kind == "solo"
        self._failures_in_a_row = 0
        for response in responses:
            sequence = self._ledger.active.get(response.uid)
            if sequence is not None:
                sequence.newcomer = False
                self._emit_checked(sequence, response)
        # The step returns token k while it computes token k+1 (pipelined), so a processor
        # failure recorded now concerns a token nobody has seen: emit k, never k+1.
        for sequence in [s for s in self._ledger.active.values() if s.failures]:
            failure = sequence.failures[0]
            reason = repr(failure)[:MAX_REASON_CHARS]  # may quote a whole grammar
            if isinstance(failure, ScriptedFault):  # the scripted model's, as its script asked
                self._ledger.remove(sequence.uid, self._stepper, "error", str(failure))
                continue
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
        self.generated_tokens += 1
        reason: FinishReason | None = response.finish_reason
        token = None if reason == "stop" else int(response.token)  # a stop token is never shown
        if reason is None:
            self._outbox.token(sequence.seq_id, StepEvent(token, logprob))
            return
        self._ledger.finish(sequence, StepEvent(token, logprob, reason, sequence.usage()))
        self._ledger.to_store.append((sequence, (response.prompt_cache, response.all_tokens)))

    def _recover(self, exc: Exception) -> None:
        """A step (or a detach) raised: replace the batch, replay its sequences, and fail
        alone the one that `judge` blames, if the model still computes without it."""
        self.failed_steps += 1
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
            if self._scripted or model_computes(self._model.model):
                self.isolated_failures += 1
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

    def replay_next_suspect(self) -> None:
        """Replay the next sequence on probation once no newcomer is in the batch."""
        if any(s.newcomer for s in self._ledger.active.values()):
            return
        self._hand_over()
        self._replay(self._ledger.probation.pop(next(iter(self._ledger.probation))))

    def _replay(self, sequence: LiveSequence, *, after_failure: bool = True) -> None:
        """Insert `sequence` into the batch afresh: its prompt and posted tokens are prefilled
        again; its sampler's next draw is its next token's."""
        self.replays += after_failure
        rewind_sampler(sequence.sampler, len(sequence.tokens))
        prompt = [*sequence.request.prompt_tokens, *sequence.tokens]
        remaining = sequence.request.max_tokens - sequence.generated
        images = sequence.request.images
        if images is not None:  # its images go through the vision tower again
            try:
                self._begin_image_prefill(sequence, prompt, images)
            except Exception:  # fails this request only
                log.exception("could not replay sequence %d", sequence.seq_id)
                self._ledger.finish(sequence, sequence.final("error", _COULD_NOT_CONTINUE))
            return
        try:
            uid = self._batch.insert(sequence, Start(prompt, None, [], remaining))
        except Exception:  # fails this request only
            log.exception("could not replay sequence %d", sequence.seq_id)
            self._ledger.finish(sequence, sequence.final("error", _COULD_NOT_CONTINUE))
            return
        self._ledger.track(sequence, uid)

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
            key = self._cache_key(sequence, list(tokens))
            if key is None:
                continue
            try:
                self._cache.insert(self._namespace(sequence), key, list(cache))
            except Exception:  # caching is an optimisation, never a failure
                log.exception("could not store a prefix-cache entry")

    def _retire_batch(self) -> None:
        """Close the batch stepper; sequences still to detach from it go with it."""
        self._ledger.detaching = [
            (s, stepper) for s, stepper in self._ledger.detaching if stepper is not self._batch
        ]
        self.retired_prefill += self._batch.prefilled
        self._batch.close()
