"""Samplers for one request (their logits processors: `_processors.py`).

Where ours differ from mlx-lm's, and why:
- `KeyedSampler` draws every token from a key of its own, seeded or not. mlx-lm's
  samplers and filters (`make_sampler`, `apply_top_k`, ...) are compiled with MLX's
  global random state as an input and an output; an exception inside one of them (a
  `top_k` at the vocabulary's size, say) left that state without a primitive, and every
  later unseeded request failed until the engine died. No request may touch that
  state, so the filters here are our own, and a draw's key depends only on the seed and
  the draw's index: a sequence replayed after a failed batch step draws again exactly
  what it would have drawn (`rewind`).
- A logit bias is applied by the sampler, for all rows of a step in one scatter-add, not
  as a logits processor: mlx-lm's batch runs its processors row by row (a slice, the
  processor's ops and a concatenation per row, for every row of the batch once any row has
  one), which cost a 32-row step hundreds of kernel launches where `logit_bias` was common
  (every benchmark request that suppresses EOS sends one). The draw is the same: adding the
  bias to normalized log-probabilities rather than to logits shifts each row by a constant,
  which no filter or draw here depends on. A request that wants logprobs keeps the bias as
  a processor, so that the log-probabilities it is told are the biased ones.
- `GuardedSampler` (and `_processors.GuardedProcessor`): mlx-lm applies every row's processors and
  samplers inside one batched step, so one request's exception would fail the whole
  batch; these record the error on the request and leave its row usable, and the worker
  then fails that request alone.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import NamedTuple

import mlx.core as mx

from ._types import SamplingParams
from ._upstream import greedy_sampler

Sampler = Callable[[mx.array], mx.array]
log = logging.getLogger("mlx_nursery.engine")

_MASK64 = (1 << 64) - 1


def key_words(seed: int, draw: int) -> tuple[int, int]:
    """The key of a sequence's `draw`-th token, as MLX's two key words: splitmix64 of
    (seed, draw), split as `mx.random.key` splits a 64-bit seed.

    Any integer seed works (OpenAI's are signed 64-bit): it is taken modulo 2^64.
    Keys come from the seed and the index alone, not from a chain of splits, so a
    sampler can be rewound to any draw.
    """
    z = (seed + (draw + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z >> 32, z & 0xFFFFFFFF


@mx.compile
def _top_p(logprobs: mx.array, top_p: mx.array) -> mx.array:
    # mlx-lm's apply_top_p, without the global random state (and top_p an array: no retrace).
    sorted_logprobs = mx.sort(logprobs, axis=-1)
    sorted_probs = mx.exp(sorted_logprobs.astype(mx.float32))
    mass_above = mx.cumsum(sorted_probs, axis=-1, reverse=True, inclusive=False)
    total_mass = mass_above[..., :1] + sorted_probs[..., :1]
    num_dropped = (mass_above >= top_p * total_mass).sum(axis=-1, keepdims=True)
    # A top_p that underflows drops everything: keep the most likely token, as top_p -> 0 does.
    num_dropped = mx.minimum(num_dropped, logprobs.shape[-1] - 1)
    threshold = mx.take_along_axis(sorted_logprobs, num_dropped, axis=-1)
    return mx.where(logprobs < threshold, -float("inf"), logprobs)


@mx.compile
def _min_p(logprobs: mx.array, log_min_p: mx.array) -> mx.array:
    threshold = mx.max(logprobs, axis=-1, keepdims=True) + log_min_p
    return mx.where(logprobs < threshold, -float("inf"), logprobs)


def _uniform(key: mx.array) -> mx.array:
    return mx.random.uniform(shape=(1,), key=key)


_uniform_rows = mx.vmap(_uniform)


@mx.compile
def _draw_rows(logprobs: mx.array, keys: mx.array, inverse_temperature: mx.array) -> mx.array:
    """One categorical draw per row, each with its row's key, by the inverse CDF as
    `mx.random.categorical` draws a single row; rows are independent of each other, so a
    row draws the same token alone or in any batch."""
    x = (logprobs * inverse_temperature).astype(mx.float32)
    top = mx.max(x, axis=-1, keepdims=True)
    # exp(x - top) is NaN where top is infinite: then the draw is uniform over the maxima.
    weights = mx.where(mx.isinf(top), (x == top).astype(mx.float32), mx.exp(x - top))
    cdf = mx.cumsum(weights, axis=-1, inclusive=False)
    target = _uniform_rows(keys) * mx.sum(weights, axis=-1, keepdims=True)
    return (mx.sum(cdf <= target, axis=-1) - 1).astype(mx.uint32)


@mx.compile
def _kth_largest_floor(logprobs: mx.array, k: mx.array) -> mx.array:
    """Drop what is below each row's k-th largest value (k per row, >= 1)."""
    ordered = mx.sort(logprobs, axis=-1)
    threshold = mx.take_along_axis(ordered, logprobs.shape[-1] - k, axis=-1)
    return mx.where(logprobs < threshold, -float("inf"), logprobs)


LogitBias = tuple[tuple[int, ...], tuple[float, ...]]
"""A row's logit bias: token ids and what is added to each."""


def _biased(logprobs: mx.array, biases: Sequence[LogitBias | None]) -> mx.array:
    """`logprobs` (B, V) with each row's bias added, all rows in one scatter-add."""
    rows: list[int] = []
    tokens: list[int] = []
    values: list[float] = []
    for row, bias in enumerate(biases):
        if bias is not None:
            rows += [row] * len(bias[0])
            tokens += bias[0]
            values += bias[1]
    if not rows:
        return logprobs
    added = mx.array(values, dtype=logprobs.dtype)
    return logprobs.at[mx.array(rows), mx.array(tokens)].add(added)


def logit_bias(params: SamplingParams) -> LogitBias | None:
    if not params.logit_bias:
        return None
    tokens = tuple(int(t) for t in params.logit_bias)
    return tokens, tuple(float(params.logit_bias[t]) for t in params.logit_bias)


class BiasedGreedy:
    """The argmax after a logit bias (`greedy_sampler`, shared by unbiased greedy rows,
    has none)."""

    def __init__(self, bias: LogitBias) -> None:
        self.bias = bias

    def __call__(self, logprobs: mx.array) -> mx.array:
        return sample_rows([None], logprobs, [self.bias])


class KeyedSampler:
    """Top-p, min-p and top-k filtering as mlx-lm does them, then a categorical draw with
    this sequence's key for this draw. A request without a seed gets a random one. Alone it
    samples its one row; in a batch, `sample_rows` samples every row in one computation."""

    def __init__(self, params: SamplingParams, bias: LogitBias | None = None) -> None:
        self.bias = bias
        self.seed = params.seed if params.seed is not None else secrets.randbits(64)
        self.draws = 0
        """Tokens drawn so far; `rewind` sets it."""
        self.top_p = params.top_p if 0.0 < params.top_p < 1.0 else None
        self.min_p = params.min_p if params.min_p > 0.0 else None
        self.top_k = params.top_k if params.top_k > 0 else None
        self.inverse_temperature = 1.0 / params.temperature
        self._alone: tuple[int, _Columns] | None = None
        """Its parameters as the arrays of a draw alone, for a vocabulary (`columns`)."""

    def rewind(self, draws: int) -> None:
        """Draw next as the `draws`-th token (a replayed sequence discards the token in flight)."""
        self.draws = draws

    def __call__(self, logprobs: mx.array) -> mx.array:
        return sample_rows([self], logprobs, [self.bias])

    def columns(self, vocabulary: int) -> _Columns:
        """Its parameters as the arrays of a draw alone: made once, not every token (a lone
        sequence's step is bound by the host building it)."""
        if self._alone is None or self._alone[0] != vocabulary:
            self._alone = (vocabulary, _columns([self], vocabulary))
        return self._alone[1]


class _Columns(NamedTuple):
    """The rows' sampling parameters as arrays, one row each; a filter's `wanted` (which
    rows it applies to) is None where it applies to every row, which then needs no select
    between filtered and unfiltered values."""

    inverse_temperature: mx.array
    top_p: tuple[mx.array, mx.array | None] | None
    min_p: tuple[mx.array, mx.array | None] | None
    top_k: mx.array | None


def _columns(rows: Sequence[KeyedSampler | None], vocabulary: int) -> _Columns:
    keyed = [row for row in rows if row is not None]
    top_p = min_p = None
    if any(r.top_p is not None for r in keyed):
        values = mx.array([[r.top_p or 1.0] if r else [1.0] for r in rows])
        top_p = values, _wanted([r is not None and r.top_p is not None for r in rows])
    if any(r.min_p is not None for r in keyed):
        values = mx.log(mx.array([[r.min_p or 1.0] if r else [1.0] for r in rows]))
        min_p = values, _wanted([r is not None and r.min_p is not None for r in rows])
    # k at or past the vocabulary filters nothing.
    ks = [r.top_k if r and r.top_k and r.top_k < vocabulary else vocabulary for r in rows]
    top_k = mx.array([[k] for k in ks]) if any(k < vocabulary for k in ks) else None
    inverse_temperature = mx.array([[r.inverse_temperature if r else 1.0] for r in rows])
    return _Columns(inverse_temperature, top_p, min_p, top_k)


def _wanted(flags: list[bool]) -> mx.array | None:
    return None if all(flags) else mx.array([[flag] for flag in flags])


def _filtered(x: mx.array, filtered: mx.array, wanted: mx.array | None) -> mx.array:
    return filtered if wanted is None else mx.where(wanted, filtered, x)


def sample_rows(
    rows: Sequence[KeyedSampler | None],
    logprobs: mx.array,
    biases: Sequence[LogitBias | None] = (),
    *,
    draws: Sequence[int] | None = None,
) -> mx.array:
    """Sample every row of `logprobs` (B, V) in one computation: row i by `rows[i]` (None:
    the argmax), after its bias `biases[i]` (if any). Each keyed row's draw counter advances
    only once the whole computation is built, so a failure leaves every sampler where it
    was. With `draws`, row i is drawn as its sampler's `draws[i]`-th token and no counter
    advances (speculation's verify: one sequence's positions as rows)."""
    if any(bias is not None for bias in biases):
        logprobs = _biased(logprobs, biases)
    keyed = [row for row in rows if row is not None]
    if not keyed:
        return mx.argmax(logprobs, axis=-1)
    vocabulary = logprobs.shape[-1]
    indexes = draws if draws is not None else [r.draws if r is not None else 0 for r in rows]
    keys = mx.array(
        [
            key_words(r.seed, i) if r is not None else (0, 0)
            for r, i in zip(rows, indexes, strict=True)
        ],
        dtype=mx.uint32,
    )
    alone = rows[0] if len(rows) == 1 else None
    columns = alone.columns(vocabulary) if alone is not None else _columns(rows, vocabulary)
    x = logprobs
    if columns.top_p is not None:
        x = _filtered(x, _top_p(x, columns.top_p[0]), columns.top_p[1])
    if columns.min_p is not None:
        x = _filtered(x, _min_p(x, columns.min_p[0]), columns.min_p[1])
    if columns.top_k is not None:
        x = _kth_largest_floor(x, columns.top_k)
    drawn = _draw_rows(x, keys, columns.inverse_temperature)
    if len(keyed) < len(rows):
        greedy = mx.array([row is None for row in rows])
        drawn = mx.where(greedy, mx.argmax(logprobs, axis=-1).astype(mx.uint32), drawn)
    if draws is None:
        for row in keyed:
            row.draws += 1
    return drawn


class PositionDraws:
    """Draws the tokens of several positions of one sequence, each exactly as its sampler
    would draw that position's token alone (the same key, filters and bias): what a verify
    step compares drafted tokens with (`_speculating.py`). Its sampler's counter advances
    only by `advance`, once the tokens kept are known."""

    def __init__(self, keyed: KeyedSampler | None, bias: LogitBias | None) -> None:
        self._keyed = keyed
        self._bias = bias

    def __call__(self, logprobs: mx.array, skip: int = 0) -> mx.array:
        """Tokens for the rows of `logprobs` (L, V): row i as the sampler's next draw plus
        `skip` plus i (`skip`: the positions of a verify still in flight before these)."""
        length = logprobs.shape[0]
        keyed = self._keyed
        first = (keyed.draws if keyed is not None else 0) + skip
        return sample_rows(
            [keyed] * length,
            logprobs,
            [self._bias] * length,
            draws=range(first, first + length),
        )

    def parts(self) -> tuple[KeyedSampler | None, LogitBias | None, int]:
        """Its keyed sampler (None: the argmax), its bias, and the index of its next draw:
        what `sample_rows` needs to draw its positions among other rows' (the batch's
        verify, `_batch_speculating.py`)."""
        keyed = self._keyed
        return keyed, self._bias, keyed.draws if keyed is not None else 0

    def advance(self, tokens: int) -> None:
        if self._keyed is not None:
            self._keyed.draws += tokens


def position_draws(sampler: Sampler) -> PositionDraws | None:
    """`sampler` as `PositionDraws`, if it is one of ours (greedy, keyed or biased greedy,
    its guard not failed); None for any other (a test's faulting sampler): it decodes
    without drafts."""
    row = _batch_row(sampler)
    if row is _UNBATCHABLE or (isinstance(sampler, GuardedSampler) and sampler.failures):
        return None
    assert isinstance(row, tuple)
    return PositionDraws(row[0], row[1])


class GuardedSampler:
    """Run `sampler`; on an exception, record it in `failures` and take the row's argmax, so
    that the batch's step completes. The worker then fails this request alone."""

    def __init__(self, sampler: Sampler, failures: list[BaseException]) -> None:
        self.sampler = sampler
        self.failures = failures

    def rewind(self, draws: int) -> None:
        rewind_sampler(self.sampler, draws)

    def __call__(self, logprobs: mx.array) -> mx.array:
        if not self.failures:
            try:
                token = self.sampler(logprobs)
                if not isinstance(token, mx.array) or token.shape != logprobs.shape[:-1]:
                    raise TypeError(
                        f"sampler returned {type(token).__name__} "
                        f"{getattr(token, 'shape', '')}, expected shape {logprobs.shape[:-1]}"
                    )
                return token
            except Exception as exc:  # noqa: BLE001 - isolated per request by design
                self.failures.append(exc)
        return mx.argmax(logprobs, axis=-1)


def sample_batch(samplers: Sequence[Sampler], logprobs: mx.array) -> mx.array:
    """Sample a batch's rows, row i by `samplers[i]`: in one computation when every row's
    sampler is one of ours (greedy, or a keyed one, guarded), which draws exactly what each
    would alone; otherwise, or if that computation fails to build, row by row, each row's
    guard recording its own failure (the worker then fails that request alone).

    Why: mlx-lm's `BatchGenerator` samples all rows in one call only when they share one
    sampler object, and every request here has its own (its key and its draw count), so
    rows were sampled one by one, a graph each, at a measured cost of most of a decode
    step's time on a GPU with 32 rows (docs/benchmarks.md, "Sampling cost")."""
    rows = [_batch_row(sampler) for sampler in samplers]
    if not any(row is _UNBATCHABLE for row in rows):
        try:
            return sample_rows(
                [r[0] if isinstance(r, tuple) else None for r in rows],
                logprobs,
                [r[1] if isinstance(r, tuple) else None for r in rows],
            )
        except Exception:
            log.warning("a batched draw failed to build; sampling row by row", exc_info=True)
    return mx.concatenate([s(logprobs[i : i + 1]) for i, s in enumerate(samplers)], axis=0)


_UNBATCHABLE = object()


def _batch_row(sampler: Sampler) -> tuple[KeyedSampler | None, LogitBias | None] | object:
    """What `sample_rows` needs of a row's sampler: its keyed sampler (None for the argmax:
    greedy, or a guard that has failed) and its logit bias; or `_UNBATCHABLE` for a sampler
    of another kind."""
    if sampler is greedy_sampler:
        return None, None
    if isinstance(sampler, GuardedSampler):
        inner = sampler.sampler
        if isinstance(inner, KeyedSampler):
            return (None if sampler.failures else inner), inner.bias
        if isinstance(inner, BiasedGreedy):
            return None, inner.bias
    return _UNBATCHABLE


_GREEDY_BELOW = 1e-30
"""Temperatures this small are argmax: their inverse overflows float32, and logits times
infinity are no distribution."""


def make_request_sampler(
    params: SamplingParams, failures: list[BaseException], *, with_bias: bool = True
) -> Sampler:
    """The request's sampler; with `with_bias`, it applies the request's logit bias (then
    `make_request_processors` must be told not to)."""
    bias = logit_bias(params) if with_bias else None
    if params.temperature < _GREEDY_BELOW:
        if bias is not None:
            return GuardedSampler(BiasedGreedy(bias), failures)
        greedy: Sampler = greedy_sampler  # shared: the batch samples greedy rows in one call
        return greedy
    return GuardedSampler(KeyedSampler(params, bias), failures)


def rewind_sampler(sampler: Sampler, draws: int) -> None:
    """Make `sampler`'s next draw its `draws`-th (a no-op for stateless samplers)."""
    rewind = getattr(sampler, "rewind", None)
    if rewind is not None:
        rewind(draws)
