"""Speculative decoding on the single-sequence fast path: a lone sequence's verify steps.

A verify step feeds the sequence's next input token and the tokens drafted after it
(`_drafting.NgramIndex`, or a draft model: `_draft_model.ModelDrafter`) in one forward on
its KV cache, draws the token of every position exactly as plain decoding would draw it
there (`_sampling.PositionDraws`: the same key, the same filters), and keeps the drafts up
to the first that differs from its position's draw, then that position's draw. The KV of
the rejected drafts is trimmed away at once, so the cache never holds a token the sequence
did not keep.

Why drawing by position is exact: plain decoding's token at each position is a function of
the context and that position's key. The drafts kept are those equal to it, and the token
after them is it, so the output is the one plain decoding gives, greedy or seeded, token for
token (to floating point: a forward of several positions may round differently). For a
sampled row this is the standard accept/resample rule for a deterministic draft: a draft d
is kept with probability p(d), and when it is not the token drawn follows p without d,
renormalized; the key that draws the position decides both at once.

Rows with logits processors (penalties, a grammar, logit bias kept as a processor for
logprobs) decode without drafts: a processor sees the context token by token. Caches other
than mlx-lm's `KVCache` and `QuantizedKVCache` (a rotating window, recurrent state) decode
without drafts too: they cannot be trimmed back exactly. Engine thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import mlx.core as mx

from ._draft_model import ModelDrafter
from ._drafting import DraftControl, NgramIndex, Speculation, VerifyCosts
from ._sampling import PositionDraws, Sampler, position_draws
from ._sequence import LiveSequence
from ._upstream import KVCache, QuantizedKVCache, generation_stream, trim_prompt_cache

Verified = Callable[[int, int], None]
"""Told each verify step's drafted tokens and the accepted ones that the sequence kept."""
SpeculatorFactory = Callable[[list[Any], list[int]], "Speculator | None"]
"""A sequence's speculator, given its KV cache and its context (None: it does not draft)."""


@attrs.define
class Verify:
    """A verify forward in flight: its inputs and, lazily, each position's drawn token."""

    first: int | None
    """The first input token (None until it is read: it was itself still computing)."""
    drafts: list[int]
    tokens: mx.array
    logprobs: mx.array
    """(positions, vocabulary): each position's log-probabilities."""
    started: float
    """When the engine thread last waited for a token before launching it: from then to its
    read the device ran it, and, `ahead`, the step of its first input before it."""
    ahead: bool
    """Launched while its first input was still computing (read since)."""

    @property
    def positions(self) -> int:
        return len(self.drafts) + 1


@attrs.frozen
class Outcome:
    """A resolved verify: the tokens it gives (drafts kept, then one drawn) and how many of
    them were drafts."""

    tokens: list[int]
    accepted: int
    first: int
    continued: bool = False
    """The verify launched behind it holds: every draft was accepted and the sequence goes on."""


def speculable(cache: list[Any]) -> bool:
    """Every layer's cache can be trimmed back exactly (mlx-lm's plain and quantized ones)."""
    return all(isinstance(layer, KVCache | QuantizedKVCache) for layer in cache)


class Speculator:
    """One sequence's drafting: its context's n-grams, its draft control, its draws."""

    def __init__(
        self,
        spec: Speculation,
        model: Any,
        context: list[int],
        draws: PositionDraws,
        costs: VerifyCosts,
        verified: Verified,
        draft_model: Any = None,
    ) -> None:
        self._model = model
        self.index = draft_source(spec, draft_model, context)
        """Where drafts come from: the context's n-grams, or the draft model."""
        self.control = DraftControl(spec.tokens, costs, adaptive=spec.adaptive)
        self.costs = costs
        self._draws = draws
        self._verified = verified
        self.last_read: float | None = None
        """When the engine thread last waited for a token (a plain one or a verify's)."""
        self._restarting: tuple[int, float | None] | None = None
        """A verify just read, nothing launched behind it kept (its drafts, its seconds): the
        step after it was built only then, behind any verify launched behind it and dropped,
        so its time beyond a plain step's is the verify's too (a plain step's building
        overlaps the step before it)."""

    @classmethod
    def build(
        cls,
        spec: Speculation | None,
        model: Any,
        cache: list[Any],
        context: list[int],
        sampler: Sampler,
        processors: list[Any],
        costs: VerifyCosts,
        verified: Verified,
        draft_model: Any = None,
    ) -> Speculator | None:
        """A speculator for a sequence that may draft, else None (why not: the module's
        docstring). `draft_model`: drafts come from it (None: from the context's n-grams)."""
        if spec is None or processors or not speculable(cache):
            return None
        draws = position_draws(sampler)
        if draws is None:
            return None
        return cls(spec, model, context, draws, costs, verified, draft_model)

    def plan(self) -> int:
        """How many tokens the next step may draft (the control's choice: 0 decodes
        plainly; a pause yields to a context that recurs, prompt lookup only). Asked once
        per step."""
        index = self.index
        return self.control.drafts(recurring=isinstance(index, NgramIndex) and index.recurs())

    @property
    def pipelines(self) -> bool:
        """Its drafts can be looked up past drafts still being verified (prompt lookup; a
        draft model would have to wait for the verify to know what to draft after)."""
        return isinstance(self.index, NgramIndex)

    def drafts(
        self, planned: int, room: int, *, ahead: bool, assumed: Sequence[int] = ()
    ) -> list[int]:
        """Drafts for the next step, at most `planned` and `room`. `ahead`: the context lacks
        the next input token (still computing), so the draft is looked up one token earlier
        and its first token, the guess at that input, is dropped. `assumed`: drafts of a
        verify in flight, taken as accepted (before them, the context; prompt lookup only)."""
        most = min(planned, room)
        if most <= 0:
            return []
        wanted = most + 1 if ahead else most
        if assumed:
            assert isinstance(self.index, NgramIndex)
            drafted = self.index.draft(wanted, assumed)
        else:
            drafted = self.index.draft(wanted)
        return drafted[1:] if ahead else drafted

    def plain_read(self, *, timed: bool, pipelined: bool = True) -> None:
        """A plain token was read; `timed`: the time since the last read is its step's alone
        (not when a verify launched before the read ran meanwhile: waiting for a token waits
        for the work launched after it on the stream too, on MLX's CPU backend at least).
        `pipelined`: its step was built before the last read, as plain steps are; one built
        after it (the second token's, after the first one's read) also holds its building
        and the host's work on that read, so it teaches no plain cost, or the first plain
        cost learned, which a speculating sequence may never correct, is several times a
        step's (a step after a verify's read is that verify's: `_restarting`)."""
        now = time.perf_counter()
        if self._restarting is not None:
            # Launched after a verify's read: its extra time is that verify's. Untimed (a
            # verify launched before this read), that one's interval holds it: not twice.
            plain = self.costs.plain_s
            extra = 0.0
            if timed and plain is not None and self.last_read is not None:
                extra = max(0.0, now - self.last_read - plain)
            self._flush_restart(extra)
        elif self.last_read is not None and timed and pipelined:
            self.costs.plain(now - self.last_read)
        self.last_read = now

    def launch(
        self,
        cache: list[Any],
        first: mx.array,
        drafts: list[int],
        before_launch: Callable[[], None] | None,
        *,
        ahead: bool,
        behind: Verify | None = None,
    ) -> Verify:
        """Start the verify forward of `first` (a 1-element token array; `ahead`: still
        computing) and `drafts`. `behind`: a verify in flight whose last drawn token is
        `first`; this one follows it as if all its drafts were accepted (its positions are
        drawn after that one's) and is kept only if they are (`resolve`)."""
        inputs = mx.concatenate([first.astype(mx.uint32), mx.array(drafts, dtype=mx.uint32)])
        with mx.stream(generation_stream):
            logits = self._model(inputs[None], cache=cache)[0]
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            tokens = self._draws(logprobs, skip=behind.positions if behind else 0)
        if before_launch is not None:
            before_launch()
        mx.async_eval(tokens, logprobs)  # type: ignore[no-untyped-call]
        started = self.last_read if self.last_read is not None else time.perf_counter()
        return Verify(None, drafts, tokens, logprobs, started, ahead)

    def resolve(
        self,
        verify: Verify,
        cache: list[Any],
        room: int,
        stop: frozenset[int],
        after: Verify | None = None,
    ) -> Outcome:
        """Read a verify, keep its tokens up to the first stop token, at most `room`, and trim
        the KV of the rest; the control and the counters learn how it went. `after`: a verify
        launched behind this one (`launch`), kept (`Outcome.continued`) only if every draft
        was accepted and the sequence goes on; else its KV is trimmed too, its draws never
        counted."""
        drawn: list[int] = verify.tokens.tolist()  # type: ignore[assignment]
        now = time.perf_counter()
        self._flush_restart()
        seconds: float | None = now - verify.started
        plain = self.costs.plain_s
        if verify.ahead:  # the plain step of its first input ran in that time too
            seconds = None if plain is None else now - verify.started - plain
        self.last_read = now
        drafts = verify.drafts
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == drawn[accepted]:
            accepted += 1
        self.control.verified(len(drafts), accepted)
        tokens = [*drafts[:accepted], drawn[accepted]][:room]
        for i, token in enumerate(tokens):
            if token in stop:
                del tokens[i + 1 :]
                break
        kept = min(accepted, len(tokens))  # drafts whose KV stays: those emitted
        ends = tokens[-1] in stop or len(tokens) >= room  # no step comes after
        continued = after is not None and len(tokens) == verify.positions and not ends
        dropped = len(drafts) - kept
        if continued:
            assert after is not None
            after.first = tokens[-1]
            after.started = now  # from here the device runs it alone
        elif after is not None:
            dropped += after.positions
        if continued or ends:
            self.costs.observed(1, len(drafts), seconds)
        else:
            self._restarting = (len(drafts), seconds)  # the next read tells the rest
        trim_prompt_cache(cache, dropped)
        self._draws.advance(len(tokens))
        self._verified(len(drafts), kept)
        assert verify.first is not None
        return Outcome(tokens, kept, verify.first, continued)

    def _flush_restart(self, extra: float = 0.0) -> None:
        """Charge the verify read before, whose next step was built only after its read, its
        own seconds and `extra` (that step's time beyond a plain step's, where it is known;
        a verify launched after it holds its own building in its own interval)."""
        if self._restarting is not None:
            drafts, seconds = self._restarting
            self._restarting = None
            self.costs.observed(1, drafts, None if seconds is None else seconds + extra)

    def discard(self, verify: Verify, cache: list[Any]) -> None:
        """Drop a verify in flight (a handover, a cancel): its KV goes, its draws were never
        counted; a verify read before it is charged as read."""
        self._flush_restart()
        mx.eval(verify.tokens)  # let it land before the cache is trimmed and kept
        trim_prompt_cache(cache, verify.positions)


def draft_source(
    spec: Speculation, draft_model: Any, context: list[int]
) -> NgramIndex | ModelDrafter:
    """A sequence's drafts' source: its context's n-grams, or the draft model (if given)."""
    if draft_model is None:
        return NgramIndex(spec, context)
    return ModelDrafter(draft_model, context)


def verify_counter(
    sequence: LiveSequence, report: Callable[[LiveSequence, int, int], None] | None
) -> Verified:
    """What each verify of `sequence` tells (its drafted and kept tokens): counted on the
    sequence (its usage) and told to `report` (the engine's counters)."""

    def verified(drafted: int, accepted: int) -> None:
        sequence.drafted_tokens += drafted
        sequence.accepted_tokens += accepted
        if report is not None:
            report(sequence, drafted, accepted)

    return verified


def speculator_factory(
    spec: Speculation | None,
    model: Any,
    sequence: LiveSequence,
    costs: VerifyCosts,
    report: Callable[[LiveSequence, int, int], None] | None,
    draft_model: Any = None,
) -> SpeculatorFactory | None:
    """How the fast path makes `sequence`'s speculator (None: speculation is off). Its verify
    steps count on the sequence (its usage) and are reported to `report` (the engine's)."""
    if spec is None:
        return None
    # Verify forwards are decode steps: the shape statistics count prefill forwards only.
    unwatched = getattr(model, "unwatched", model)

    verified = verify_counter(sequence, report)

    def speculate(cache: list[Any], context: list[int]) -> Speculator | None:
        return Speculator.build(
            spec,
            unwatched,
            cache,
            context,
            sequence.sampler,
            sequence.processors,
            costs,
            verified,
            draft_model,
        )

    return speculate
