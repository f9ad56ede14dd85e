"""A request's logit bias, applied by its sampler: every row of a step in one scatter-add
(`_sampling.py`'s docstring says why not as a logits processor). Engine thread only."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import mlx.core as mx

from ._types import SamplingParams

LogitBias = tuple[tuple[int, ...], tuple[float, ...]]
"""A row's logit bias: token ids and what is added to each."""


def biased(logprobs: mx.array, biases: Sequence[LogitBias | None]) -> mx.array:
    """`logprobs` (B, V) with each row's bias added, all rows in one scatter-add."""
    scatter = _bias_scatter(tuple(biases), logprobs.dtype)
    if scatter is None:
        return logprobs
    rows, tokens, added = scatter
    return logprobs.at[rows, tokens].add(added)


class _BiasScatters(threading.local):
    """The index and value arrays of recent steps' biases, per engine thread: a batch's
    rows and a lone sequence keep theirs for many steps, and arrays made from Python lists
    every step cost the host (and, on CUDA, fresh uploads) what a step's launch does. Keyed
    by the biases' identities (a request's `LogitBias` is made once), each entry holding the
    biases themselves, so that no identity is reused while its entry lives."""

    def __init__(self) -> None:
        self.arrays: dict[_ScatterKey, tuple[tuple[LogitBias | None, ...], _Scatter | None]]
        self.arrays = {}


_Scatter = tuple[mx.array, mx.array, mx.array]
_ScatterKey = tuple[tuple[int, ...], mx.Dtype]
_SCATTERS = _BiasScatters()
_SCATTERS_KEPT = 64


def _bias_scatter(biases: tuple[LogitBias | None, ...], dtype: mx.Dtype) -> _Scatter | None:
    cached = _SCATTERS.arrays
    key = (tuple(map(id, biases)), dtype)
    if key in cached:
        return cached[key][1]
    rows: list[int] = []
    tokens: list[int] = []
    values: list[float] = []
    for row, bias in enumerate(biases):
        if bias is not None:
            rows += [row] * len(bias[0])
            tokens += bias[0]
            values += bias[1]
    scatter = None
    if rows:
        scatter = mx.array(rows), mx.array(tokens), mx.array(values, dtype=dtype)
    if len(cached) >= _SCATTERS_KEPT:
        cached.clear()
    cached[key] = biases, scatter
    return scatter


def logit_bias(params: SamplingParams) -> LogitBias | None:
    if not params.logit_bias:
        return None
    tokens = tuple(int(t) for t in params.logit_bias)
    return tokens, tuple(float(params.logit_bias[t]) for t in params.logit_bias)
