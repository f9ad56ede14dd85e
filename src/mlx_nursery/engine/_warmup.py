"""A warm-up before the engine reports ready: the kernels real traffic needs, built before
any request waits for them.

MLX builds kernels on first use. On CUDA it compiles them at run time (NVRTC), one module
per fused graph, data type and broadcasting pattern, and a fresh machine's first requests
waited tens of seconds for modules that a small dummy prompt had not needed
(docs/decisions/0034-warm-up-runs-serving.md). So the warm-up runs what serving runs: the
engine's own steppers (the fast path, then the batch), sequences built by `build_sequence`
exactly as requests are, with the sampling a server meets (greedy; temperature with top-p,
top-k, min-p and seeds; a logit bias; penalties; log-probabilities), prompts longer than a
prefill chunk, a sequence leaving with its KV kept for the prefix cache, and batches of
growing size up to the engine's concurrency (a batch of one broadcasts differently from a
batch of many, and the batch's joins and leaves have kernels of their own). With speculative
decoding on, verify steps too (the fast path's and a batch's: forwards of several positions,
their draws, the realignment, and the draft model's rounds), drafting on every step from
prompts that repeat, since a verify's first run of a shape would otherwise build them in a
request's step and teach the control a cost that is not a verify's.

It is bounded in time: each batch size is one phase, each phase is logged, and once
`budget_s` has passed the remaining phases are skipped (logged; their kernels are then built
on first use). Engine thread; the server's /health answers 503 until it is done.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import attrs

from ..models import LoadedModel
from ._decode_attention import SPLIT_KEYS
from ._drafting import Speculation
from ._kv_quant import CacheFactory
from ._messages import Submit
from ._sequence import LiveSequence, build_sequence, token_logprob
from ._solo import SoloStepper
from ._stepper import BatchStepper, Start, Stepper
from ._types import GenerationRequest, SamplingParams

log = logging.getLogger("mlx_nursery.engine")

PROMPT_TOKENS = 48
NEW_TOKENS = 3
LONG_PROMPT_TOKENS = SPLIT_KEYS + PROMPT_TOKENS
"""The first prompt of the smallest batch: long enough that its decode attention on CUDA
takes the form split over slices of keys (`_decode_attention.SPLIT_KEYS`), which a
lone long request in a small batch takes."""
WARMUP_PATIENCE_S = 300.0
"""Distributed, how long beyond its budget every rank waits for the others in the warm-up:
one step's first compiles, every kernel at once on a machine that never built them."""
SOLO_COMMON = 2
"""The fast path's variants warmed before the batches (greedy, a temperature draw)."""
REPEAT_CYCLE = 5
"""The period of the verify phase's prompts (short: drafts are found at once)."""
VERIFY_TOKENS = 8
"""Tokens more that the verify phase's sequences generate: a few verify steps each."""
Verified = Callable[[LiveSequence, int, int], None]
"""Told of each verify step of a sequence (its drafted and accepted tokens)."""
MAX_STEPS = 200
"""Steps of one phase at most beyond its longest prompt's tokens (a prefill chunk takes one
at least): more than a phase needs, a bound should a stepper change."""

VARIANTS: tuple[tuple[SamplingParams, int | None], ...] = (
    (SamplingParams(temperature=0.0), None),
    (SamplingParams(temperature=0.7), None),
    (SamplingParams(temperature=0.7, top_p=0.9, seed=7), None),
    (SamplingParams(temperature=1.0, top_k=20, min_p=0.05), None),
    (SamplingParams(temperature=0.0, logit_bias={2: -100.0}), None),
    (SamplingParams(temperature=0.7, logit_bias={2: -100.0}), None),
    (SamplingParams(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.5), None),
    (SamplingParams(temperature=0.0, repetition_penalty=1.1), 2),
    (SamplingParams(temperature=0.7, logit_bias={2: -100.0}), 0),
)
"""The sampling of the warm-up's sequences, with their `logprobs` (None: not asked): each
variant runs other kernels (a biased draw, a penalty's scatter, top-k's sort, ...)."""


@attrs.frozen
class WarmupPlan:
    """What the warm-up runs: the fast path if the engine has one (a sequence of each of the
    first `solo_variants` of `VARIANTS` alone), then a batch of each size in `batch_sizes`
    (mixing every variant), within `budget_s` seconds."""

    batch_sizes: tuple[int, ...]
    solo_variants: int
    prefill_step_size: int
    prefill_batch_size: int
    fast_path: bool = True
    budget_s: float = 60.0
    speculation: Speculation | None = None
    """The engine's speculative decoding (None: off): its verify steps are warmed too."""
    pack_chunks: bool = False
    """Chunks run in the decode step's forward (`EngineConfig.pack_chunks`), as served."""
    long_prompt: bool = False
    """The smallest batch's first prompt `LONG_PROMPT_TOKENS` long: where the decode
    attention has a split form (the ragged kernel, on CUDA) that only long rows take."""


def plan_for(
    *,
    gpu: bool,
    max_concurrency: int,
    prefill_step_size: int,
    prefill_batch_size: int,
    fast_path: bool,
    budget_s: float,
    speculation: Speculation | None = None,
    pack_chunks: bool = False,
    split_keys: bool = False,
) -> WarmupPlan:
    """The warm-up for a backend: on a GPU every variant alone and batches up to
    `max_concurrency`; on the CPU, which compiles per function rather than per broadcasting
    pattern and has no per-kernel compiler to wait for, the fast path's two paths (argmax,
    a keyed draw) and one mixed batch. `split_keys`: the decode attention splits long rows'
    keys (the ragged kernel), so one long prompt runs."""
    return WarmupPlan(
        batch_sizes=batch_sizes(max_concurrency, gpu=gpu),
        solo_variants=len(VARIANTS) if gpu else 2,
        prefill_step_size=prefill_step_size,
        prefill_batch_size=prefill_batch_size,
        fast_path=fast_path,
        budget_s=budget_s,
        speculation=speculation,
        pack_chunks=pack_chunks,
        long_prompt=split_keys,
    )


def batch_sizes(max_concurrency: int, *, gpu: bool) -> tuple[int, ...]:
    """The batch sizes to warm: on a GPU a ramp to `max_concurrency` (1, 2, 3, 4, 6, 8, 12,
    16, 24, 32, ...; a new size after the first costs little, a new pattern much); on the
    CPU, whose compiled kernels do not depend on the batch's size, the sizes that broadcast
    differently (one row, several rows)."""
    if max_concurrency < 2:
        return ()
    if not gpu:
        return (min(3, max_concurrency),)
    sizes = [2, 3]
    while sizes[-1] < max_concurrency:
        sizes.append(sizes[-2] * 2)  # 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, ...
    return (*(s for s in sizes if s < max_concurrency), max_concurrency)


def warm_up(
    model: LoadedModel,
    plan: WarmupPlan,
    make_cache: CacheFactory,
    *,
    kv_quantized: bool,
    make_batch: Callable[[], Stepper] | None = None,
) -> float:
    """Run `plan` on `model` (KV caches made by `make_cache`); return the seconds it took.
    `make_batch` makes the batch stepper of every batch phase (the engine's own, which
    every rank mirrors when distributed); None: one per phase, as wide as the phase.
    Raises what the model raises (the engine then fails to start, as a model that cannot
    compute should)."""
    started = time.perf_counter()
    eos = frozenset(int(t) for t in model.tokenizer.eos_token_ids)
    vocabulary = model.vocab_size
    seq_ids = itertools.count()

    def sequences(
        count: int,
        offset: int,
        *,
        repeating: bool = False,
        longest_draft: int = 0,
        long_first: bool = False,
    ) -> list[LiveSequence]:
        """`repeating`: for verify steps, with room for drafts of `longest_draft`;
        `long_first`: the first prompt `LONG_PROMPT_TOKENS` long."""
        verifying = max(VERIFY_TOKENS, 2 * (longest_draft + 1)) if repeating else 0
        made = []
        for i in range(count):
            params, logprobs = VARIANTS[(offset + i) % len(VARIANTS)]
            seq_id = next(seq_ids)
            # Prompts of several lengths, longer than a chunk: chunked prefill, padded rows;
            # `repeating`: a short cycle, so that prompt lookup finds drafts on every step.
            length = PROMPT_TOKENS + 5 * (seq_id % 4)
            if long_first and i == 0:  # within a short context's half, should one be
                length = max(length, min(LONG_PROMPT_TOKENS, model.context_length // 2))
            cycle = REPEAT_CYCLE if repeating else min(vocabulary, 256) - 1
            prompt = [1 + (7 * j + seq_id) % cycle for j in range(length)]
            request = GenerationRequest(
                prompt_tokens=prompt,
                max_tokens=NEW_TOKENS + (seq_id % 3) + verifying,
                sampling=params,
                logprobs=logprobs,
                ignore_eos=True,
            )
            made.append(build_sequence(Submit(seq_id, request), eos))
        return made

    # (name, batch size; 1: the fast path, with the variants from..to). The fast path's
    # common variants first, then the batches, then its rarer variants: where the budget runs
    # out (a machine compiling every kernel for the first time), what most requests need is built.
    phases: list[tuple[str, int, int, int]] = []
    common = min(SOLO_COMMON, plan.solo_variants)
    if plan.fast_path:
        phases.append(("the fast path", 1, 0, common))
    phases += [(f"a batch of {size}", size, 0, 0) for size in plan.batch_sizes]
    speculation = None if make_batch is not None else plan.speculation  # none across devices
    if speculation is not None:
        phases.append(("speculation's verify steps", 0, 0, 0))
    if plan.fast_path and plan.solo_variants > common:
        phases.append(("the fast path's other sampling", 1, common, plan.solo_variants))
    for index, (name, size, first, last) in enumerate(phases, 1):
        elapsed = time.perf_counter() - started
        if index > 1 and elapsed > plan.budget_s:  # the first phase always runs
            log.info(
                "warm-up: %.1f s budget spent; %d of %d phases skipped (their kernels are "
                "built on first use)",
                plan.budget_s,
                len(phases) - index + 1,
                len(phases),
            )
            break
        log.info("warm-up %d/%d: %s (%.1f s so far)", index, len(phases), name, elapsed)
        if size == 0:
            assert speculation is not None
            deadline = started + plan.budget_s
            _verify_steps(model, plan, speculation, make_cache, kv_quantized, sequences, deadline)
        elif size == 1:
            for sequence in sequences(last - first, first):
                _run(_solo(model, make_cache), [sequence], keep_one=False)
        else:
            batch = (
                make_batch()
                if make_batch is not None
                else _batch(model, plan, size, make_cache, kv_quantized)
            )
            try:
                long_first = plan.long_prompt and size == min(plan.batch_sizes)
                _run(batch, sequences(size, index, long_first=long_first), keep_one=True)
            finally:
                batch.close()
    return time.perf_counter() - started


def _verify_steps(
    model: LoadedModel,
    plan: WarmupPlan,
    speculation: Speculation,
    make_cache: CacheFactory,
    kv_quantized: bool,
    sequences: Callable[..., list[LiveSequence]],
    deadline: float,
) -> None:
    """Verify steps of every draft length up to `speculation`'s, shortest first, on the fast
    path (if the engine has one) and in a batch stepper of the largest warmed size (on CUDA a
    forward of each new shape builds kernels of its own on first use, in a request's step
    otherwise; the adaptive control's first tries draft one token, then longer): drafts on
    every step (`adaptive` off). The batch's rows join in prefill groups and one leaves
    after its first token, so its verifies run at the row counts on the way, not only the
    largest. Past `deadline` (`time.perf_counter()`: the warm-up's budget) each path stops
    after its current length; the longer lengths' kernels are then built on first use."""
    fixed = attrs.evolve(speculation, adaptive=False)
    verifies = {"the fast path": 0, "a batch": 0}
    lengths: dict[str, set[int]] = {path: set() for path in verifies}
    """Each path's verify lengths run (drafts a step)."""

    def counting(path: str) -> Verified:
        def verified(sequence: LiveSequence, drafted: int, accepted: int) -> None:
            verifies[path] += 1
            lengths[path].add(drafted)

        return verified

    def lengths_in_time() -> Iterator[int]:
        for tokens in range(1, fixed.tokens + 1):
            if tokens > 1 and time.perf_counter() > deadline:
                return
            yield tokens

    if plan.fast_path:  # every length: a lone sequence drafts any up to the most
        for tokens in lengths_in_time():
            length = attrs.evolve(fixed, tokens=tokens)
            solo = _solo(model, make_cache, length, counting("the fast path"))
            _run(solo, sequences(1, 0, repeating=True, longest_draft=tokens), keep_one=False)
    size = max(plan.batch_sizes, default=0)
    for tokens in lengths_in_time() if size >= 2 else ():
        length = attrs.evolve(fixed, tokens=tokens)
        batch = _batch(model, plan, size, make_cache, kv_quantized, length, counting("a batch"))
        try:
            _run(
                batch,
                sequences(size, 0, repeating=True, longest_draft=tokens),
                keep_one=True,
            )
        finally:
            batch.close()
    log.info(
        "warm-up: verify steps: %s; drafts a step: %s",
        ", ".join(f"{n} on {p}" for p, n in verifies.items()),
        "; ".join(f"{', '.join(map(str, sorted(n))) or 'none'} on {p}" for p, n in lengths.items()),
    )


def _solo(
    model: LoadedModel,
    make_cache: CacheFactory,
    speculation: Speculation | None = None,
    verified: Verified | None = None,
) -> SoloStepper:
    """A fast-path stepper as the engine's, its prefill chunks shorter than the prompts."""
    return SoloStepper(
        model.model,
        prefill_step_size=PROMPT_TOKENS // 2,
        before_launch=_nothing,
        make_cache=make_cache,
        speculation=speculation,
        verified=verified,
        draft_model=model.draft,
    )


def _batch(
    model: LoadedModel,
    plan: WarmupPlan,
    size: int,
    make_cache: CacheFactory,
    kv_quantized: bool,
    speculation: Speculation | None = None,
    verified: Verified | None = None,
) -> BatchStepper:
    """A batch stepper `size` rows wide, as the engine's, its prefill chunks shorter than
    the prompts."""
    return BatchStepper(
        model.model,
        max_concurrency=size,
        prefill_batch_size=min(plan.prefill_batch_size, size),
        prefill_step_size=min(plan.prefill_step_size, PROMPT_TOKENS // 2),
        make_cache=make_cache if kv_quantized else None,
        speculation=speculation,
        verified=verified,
        draft_model=model.draft,
        pack_chunks=plan.pack_chunks,
    )


def _run(stepper: Stepper, sequences: Sequence[LiveSequence], *, keep_one: bool) -> None:
    """Insert `sequences`, step until each ends; with `keep_one`, the first leaves after its
    first token with its KV kept (a cancelled request whose prefix is cached)."""
    by_uid: dict[int, LiveSequence] = {}
    for sequence in sequences:
        start = Start(
            prompt=list(sequence.request.prompt_tokens),
            cache=None,
            cache_tokens=[],
            max_tokens=sequence.request.max_tokens,
        )
        by_uid[stepper.insert(sequence, start)] = sequence
    leaver = next(iter(by_uid)) if keep_one and len(by_uid) > 1 else None
    longest = max((len(s.request.prompt_tokens) for s in sequences), default=0)
    steps = MAX_STEPS + longest  # a chunk takes a token at least
    for _ in range(steps):
        if not by_uid:
            return
        for response in stepper.step():
            live = by_uid.get(response.uid)
            if live is None:
                continue
            if live.request.logprobs is not None:
                token_logprob(live, response)
            if response.finish_reason is not None:
                del by_uid[response.uid]
            elif response.uid == leaver:
                stepper.remove([leaver], keep_state=True)
                del by_uid[leaver]
                leaver = None
        failed = [s.seq_id for s in sequences if s.failures]
        if failed:
            raise RuntimeError(f"the warm-up's sequences {failed} failed: {sequences[0].failures}")
    raise RuntimeError(f"the warm-up did not end within {steps} steps")


def _nothing() -> None:
    pass
