"""Prompt-lookup (n-gram) drafting, and how much a lone sequence drafts.

Speculative decoding on the single-sequence fast path (`_speculating.py`) needs, before each
step, a guess at the tokens that follow: `NgramIndex` copies them from the sequence's own
context, after the most recent earlier occurrence of its last n tokens (longest n first).
No second model runs. Agents' traffic repeats its prompt (a file read, then rewritten), which
is where such guesses hold.

Whether a guess pays depends on the backend: a forward of k+1 positions costs about one
position's time where decoding is bound by reading the weights (a GPU), but k+1 times it
where it is bound by arithmetic (MLX's CPU backend). `DraftControl` therefore measures both
(shared by every sequence of the engine: `VerifyCosts`) and each sequence's acceptance, and
drafts the length that maximizes the expected tokens per second, none when decoding plainly
is faster; then it waits before trying again, twice as long after each try that did not pay,
so that speculation costs a request little where it never helps, unless (on the lone
stream) the context starts to recur, the sign of a copy. Engine thread only.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs
from attrs import validators as v

SPECULATION_METHODS = ("ngram", "draft")
"""ngram: prompt lookup (`NgramIndex`); draft: a draft model (`_draft_model.ModelDrafter`)."""


@attrs.frozen
class Speculation:
    """Speculative decoding's settings (`EngineConfig.speculation`)."""

    method: str = attrs.field(default="ngram", validator=v.in_(SPECULATION_METHODS))
    tokens: int = attrs.field(default=8, validator=[v.ge(1), v.le(32)])
    """The most tokens drafted for one step (the control may draft fewer)."""
    ngram_max: int = attrs.field(default=3, validator=[v.ge(1), v.le(16)])
    """The longest context suffix looked up, tried first."""
    ngram_min: int = attrs.field(default=1, validator=v.ge(1))
    """The shortest context suffix looked up before giving up."""
    draft_model: str | None = None
    """The draft model's path or name (method "draft"): a smaller model with the served
    model's tokenizer, loaded beside it."""
    adaptive: bool = True
    """Let `DraftControl` choose each step's draft length by measured costs and acceptance;
    False drafts `tokens` whenever a draft is found (tests, and benchmarks of a fixed
    length)."""

    @ngram_min.validator
    def _check_min(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value > self.ngram_max:
            raise ValueError(f"ngram_min ({value}) must not exceed ngram_max ({self.ngram_max})")

    def __attrs_post_init__(self) -> None:
        if (self.method == "draft") != (self.draft_model is not None):
            raise ValueError('a draft model goes with speculation method "draft", and only with it')


class NgramIndex:
    """A sequence's context, and where each of its n-grams last occurred with a follower.

    `_after[g]` is the position right after the most recent occurrence of g that has a token
    after it, so the context's own last n-gram (which has none yet) finds an earlier one.
    """

    def __init__(self, spec: Speculation, tokens: Iterable[int] = ()) -> None:
        self._sizes = range(spec.ngram_min, spec.ngram_max + 1)
        self._longest_first = tuple(reversed(self._sizes))
        self._tokens: list[int] = []
        self._after: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def recurs(self) -> bool:
        """The context's last `ngram_max` tokens occurred before, with a token after them: the
        strongest sign the lookup has that the text is being copied (`DraftControl.drafts`).
        Not a checkpoint; a dictionary lookup."""
        n = self._longest_first[0]
        context = self._tokens
        return len(context) >= n and tuple(context[len(context) - n :]) in self._after

    def extend(self, tokens: Iterable[int]) -> None:
        context, after = self._tokens, self._after
        for token in tokens:
            end = len(context)
            for n in self._sizes:
                if end >= n:
                    after[tuple(context[end - n : end])] = end
            context.append(token)

    def draft(self, most: int, assumed: Sequence[int] = ()) -> list[int]:
        """`most` tokens that followed the latest earlier occurrence of the context's last
        n-gram, the longest n that occurred; none if none did. A copy that reaches the
        context's end goes on from its own start (an overlapping copy, as LZ77's): a
        repeating pattern is drafted on. `assumed`: tokens taken to follow the context
        (drafts still being verified), looked up as if it held them; it is not changed."""
        context = self._tokens
        held = len(context)
        total = held + len(assumed)

        def at(i: int) -> int:
            return context[i] if i < held else assumed[i - held]

        # The n-grams whose follower is among `assumed`: the latest occurrences, not yet
        # in `_after` (those ending at the context's last token included).
        later: dict[tuple[int, ...], int] = {}
        for end in range(held, total):
            for n in self._sizes:
                if end >= n:
                    later[tuple(map(at, range(end - n, end)))] = end
        for n in self._longest_first:
            if total >= n:
                tail = tuple(map(at, range(total - n, total)))
                start = later.get(tail, self._after.get(tail))
                if start is not None:
                    drafted = [at(i) for i in range(start, min(start + most, total))]
                    period = total - start
                    while len(drafted) < most:
                        drafted.append(drafted[len(drafted) - period])
                    return drafted
        return []


_EMA = 0.2
"""Weight of a new observation in the moving averages."""
WINDOW = 9
"""The latest samples of a step's cost whose median is its estimate (`VerifyCosts`); the
lower median, so that of a stall and a typical sample the typical one counts."""
FIRST_PAUSE = 8
"""Plain steps before drafting again after the first try that did not pay."""
LONGEST_PAUSE = 256
"""The pause doubles after each try that did not pay, up to this many plain steps; a backend
where drafts could not pay much even if all were accepted waits this long at once."""
EXPLORE_DRAFTS = 1
"""Drafts of a try made to measure (a verify's cost unknown, or after a pause): one, so that
a try that fails costs little where each drafted position costs a step's time."""
GUESS_MARGIN = 0.02
"""A length longer than any measured is guessed to cost the longest's, plus this share of it
per draft more: a guess, so a longer draft must promise more than that to be tried; where
drafts are rarely accepted, the few more tokens they promise do not (equal costs made the
longest length win every near tie)."""
PROMISING_GAIN = 1.25
"""The speed-up drafting must promise on this backend with every draft accepted for a
sequence to try again soon after a pause."""


def _average(old: float, new: float) -> float:
    return old + _EMA * (new - old)


class VerifyCosts:
    """What a step costs on this engine's backend and model, measured on the fast path and
    shared by its sequences: a plain decode step, and a verify step by its number of drafts.

    A verify costs more than a plain step even with few drafts: it is read before the next
    step is built (a plain step's building overlaps the one before it), and a draft model
    runs before it. So a verify's cost is a fixed part and a part per draft, and one length's
    cost does not tell another's. Each cost is the (low) median of its latest samples (`WINDOW`):
    a step's time is noisy both ways (a kernel build or a burst of load above, and below, a
    verify launched ahead of a plain step's read, whose share of the interval is a
    difference), and one sample must not move the estimate far; a moving average kept a
    stall for long, and taking the cheapest sample as the truth made verifies look cheaper
    than plain steps, so that they were drafted where they lost. No verify is taken as
    cheaper than a plain step (it computes that step and more). Between lengths measured,
    costs are interpolated; beyond the longest, extrapolated by the slope of the two longest,
    or, with one length measured, taken as nearly equal to it (`GUESS_MARGIN`): an optimistic
    guess that the control then tries where acceptance promises a gain, so that the fixed
    part is not charged to every draft (which kept drafts off where they paid)."""

    def __init__(self) -> None:
        self._plain: deque[float] = deque(maxlen=WINDOW)
        self.plain_s: float | None = None
        """A plain step's seconds (the median of its latest samples; None: none yet)."""
        self._samples: dict[int, deque[float]] = {}
        self._verify_s: dict[int, float] = {}
        """A verify's seconds by its number of drafts (those measured)."""
        self._shapes_run: set[tuple[int, int]] = set()

    @property
    def measured(self) -> bool:
        """A verify's cost is known (of some length)."""
        return self.plain_s is not None and bool(self._verify_s)

    def plain(self, seconds: float) -> None:
        self._plain.append(seconds)
        self.plain_s = statistics.median_low(self._plain)

    def verify(self, drafts: int, seconds: float) -> None:
        if self.plain_s is None or drafts <= 0:
            return
        samples = self._samples.setdefault(drafts, deque(maxlen=WINDOW))
        samples.append(seconds)
        self._verify_s[drafts] = statistics.median_low(samples)
        self._drop_stale(drafts)

    def _drop_stale(self, drafts: int) -> None:
        """Forget the lengths whose cost the one just measured shows held a stall: a shorter
        verify costing more than this one, or a longer one costing more than this one plus,
        per extra draft, all that this one costs beyond a plain step (a verify's fixed part
        and its drafts both lie within that). A length that looks dear is not drafted, so
        its cost would not be measured again."""
        assert self.plain_s is not None
        cost = self._verify_seconds(drafts)
        for k, seconds in list(self._verify_s.items()):
            bound = cost if k < drafts else cost + (k - drafts) * (cost - self.plain_s)
            if k != drafts and seconds > bound:
                del self._verify_s[k], self._samples[k]

    def observed(self, rows: int, drafts: int, seconds: float | None) -> None:
        """A verify step of `rows` rows and `drafts` drafted positions ran and took `seconds`
        (None: not timed, other work shared its interval): learn from it unless it was that
        shape's first run. A shape's first run may build kernels (CUDA's attention graphs
        and compiled blocks, Metal's JIT), which can take many steps' time; learnt, that one
        sample would make drafting look too dear to try. An untimed run is still the shape's
        first: its kernels are built, so the next timed run teaches."""
        first = (rows, drafts) not in self._shapes_run
        self._shapes_run.add((rows, drafts))
        if not first and seconds is not None:
            self.verify(drafts, seconds)

    def has_run(self, rows: int, drafts: int) -> bool:
        """A verify of this shape has run (its next run can teach a cost)."""
        return (rows, drafts) in self._shapes_run

    def promising(self, most: int) -> bool:
        """Whether drafting up to `most` tokens, all accepted, would be `PROMISING_GAIN`
        times as fast as plain decoding by the costs measured (True while unknown)."""
        plain = self.step_seconds(0)
        if plain is None or not self.measured:
            return True
        return any(
            (k + 1) * plain >= PROMISING_GAIN * self._verify_seconds(k) for k in range(1, most + 1)
        )

    def step_seconds(self, drafts: int) -> float | None:
        """A step's expected seconds with `drafts` drafts (0: a plain step); None while a
        plain step's or any verify's cost is unknown."""
        if self.plain_s is None or not self._verify_s:
            return None
        return self.plain_s if drafts <= 0 else self._verify_seconds(drafts)

    def _verify_seconds(self, drafts: int) -> float:
        assert self.plain_s is not None
        return max(self.plain_s, self._guess(drafts))

    def _guess(self, drafts: int) -> float:
        known = self._verify_s
        if drafts in known:
            return known[drafts]
        lengths = sorted(known)
        shorter = [k for k in lengths if k < drafts]
        longer = [k for k in lengths if k > drafts]
        if shorter and longer:
            a, b = shorter[-1], longer[0]
            return known[a] + (known[b] - known[a]) * (drafts - a) / (b - a)
        if longer:  # shorter than any measured: at most that one's cost
            return known[longer[0]]
        b = lengths[-1]
        least = GUESS_MARGIN * known[b]  # a draft more costs at least this, as far as known
        if len(lengths) == 1:
            return known[b] + least * (drafts - b)
        a = lengths[-2]
        slope = max(least, (known[b] - known[a]) / (b - a))
        return known[b] + slope * (drafts - b)


class Costs(Protocol):
    """What `DraftControl` asks of the measured costs: `VerifyCosts` on the fast path, the
    running batch's size's on the batch (`_batch_speculating.BatchCosts`)."""

    @property
    def plain_s(self) -> float | None: ...

    def step_seconds(self, drafts: int) -> float | None: ...

    def promising(self, most: int) -> bool: ...


class DraftControl:
    """How many tokens one sequence drafts for its next step."""

    def __init__(self, most: int, costs: Costs, *, adaptive: bool = True) -> None:
        self._most = most
        self._adaptive = adaptive
        self._costs = costs
        self._acceptance = 0.5
        """Moving average of the share of drafted tokens accepted (an unknown sequence starts
        halfway, so that its first tries are short ones)."""
        self._whole = 0.5
        """Moving average of the share of verifies whose drafts were all accepted."""
        self._pause = 0
        self._paused = 0
        """Plain steps of the current pause so far."""
        self._next_pause = FIRST_PAUSE
        self._explore = False

    @property
    def acceptance(self) -> float:
        return self._acceptance

    @property
    def adaptive(self) -> bool:
        """It chooses by costs and acceptance (False: always the most)."""
        return self._adaptive

    @property
    def follows_through(self) -> bool:
        """A verify launched behind the one in flight, as if all its drafts held, is more
        often kept than wasted: more than half of this sequence's verifies kept every draft
        lately (none known yet: not). A wasted one costs the device a forward."""
        return self._whole > 0.5

    def drafts(self, recurring: bool = False) -> int:
        """The drafts the next step may carry (0: decode plainly). Called once per step.
        Adaptive, the first steps are plain until a plain step's cost is known: a verify's is
        judged against it, and a source that always has drafts (a draft model) would
        otherwise verify every step and never learn that none pays. `recurring`: the
        context's last n-gram occurred before (`NgramIndex.recurs`), the sign of a copy: a
        pause that has run `FIRST_PAUSE` steps ends for a try at once, rather than let a
        copy run pass undrafted (a pause doubles up to `LONGEST_PAUSE` steps, and a run of
        copied text often starts inside one); a try at most every `FIRST_PAUSE` + 1 steps
        where such signs mislead."""
        if not self._adaptive:
            return self._most
        if self._costs.plain_s is None:
            return 0
        if self._pause:
            self._paused += 1
            if recurring and self._paused > FIRST_PAUSE:
                self._pause, self._explore = 0, True
            else:
                self._pause -= 1
                self._explore = self._pause == 0
                return 0
        best = self.best()
        if best is None or self._explore:  # a try: it lasts until a step drafts (`verified`)
            return min(self._most, max(best or 0, EXPLORE_DRAFTS))
        if best == 0:
            promising = self._costs.promising(self._most)
            self._pause = self._next_pause if promising else LONGEST_PAUSE
            self._paused = 0
            self._next_pause = min(2 * self._next_pause, LONGEST_PAUSE)
        return best

    def verified(self, drafted: int, accepted: int) -> None:
        """A step drafted `drafted` tokens, of which the first `accepted` were right."""
        if drafted:
            self._acceptance = _average(self._acceptance, accepted / drafted)
            self._whole = _average(self._whole, float(accepted == drafted))
            self._explore = False  # the try after a pause was made (a step without drafts,
            # its lookup finding none, was not one: its pause would double untried)
        if self.best():
            self._next_pause = FIRST_PAUSE

    def best(self) -> int | None:
        """The draft length with the most expected tokens per second (0: plain decoding), by
        the measured costs and this sequence's acceptance; None while a cost is unknown."""
        plain = self._costs.step_seconds(0)
        if plain is None or self._costs.step_seconds(1) is None:
            return None
        best, best_rate = 0, 1.0 / plain
        expected, term = 1.0, 1.0
        for k in range(1, self._most + 1):
            term *= self._acceptance
            expected += term  # 1 + a + ... + a^k: tokens a step gives with k drafts
            seconds = self._costs.step_seconds(k)
            assert seconds is not None
            if expected / seconds > best_rate:
                best, best_rate = k, expected / seconds
        return best
