"""The warm-up (engine/_warmup.py) runs what serving runs: the fast path and batches of
growing size, every sampling variant, within its time budget, and leaves nothing behind."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from mlx_nursery.engine._kv_quant import cache_factory
from mlx_nursery.engine._warmup import VARIANTS, WarmupPlan, batch_sizes, plan_for, warm_up
from mlx_nursery.models import load_model


def test_only_a_split_decode_attention_gets_the_long_prompt() -> None:
    """The long prompt builds the ragged kernel's split form; elsewhere (Metal, the CPU, the
    kernel off) it would only lengthen every start."""

    def plan(split_keys: bool) -> WarmupPlan:
        return plan_for(
            gpu=True,
            max_concurrency=4,
            prefill_step_size=16,
            prefill_batch_size=2,
            fast_path=True,
            budget_s=60,
            split_keys=split_keys,
        )

    assert plan(True).long_prompt and not plan(False).long_prompt


def test_batch_sizes_ramp_to_the_concurrency() -> None:
    assert batch_sizes(1, gpu=True) == ()
    assert batch_sizes(8, gpu=True) == (2, 3, 4, 6, 8)
    assert batch_sizes(33, gpu=True) == (2, 3, 4, 6, 8, 12, 16, 24, 32, 33)
    assert batch_sizes(8, gpu=False) == (3,)
    assert batch_sizes(2, gpu=False) == (2,)


def test_the_gpu_plan_runs_every_phase_and_variant(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every phase runs to its end (a sequence that did not end, or whose sampler or
    processors failed, raises), with every variant alone on the fast path."""
    model = load_model(tiny_model)
    plan = plan_for(
        gpu=True,
        max_concurrency=6,
        prefill_step_size=16,
        prefill_batch_size=4,
        fast_path=True,
        budget_s=600,
    )
    assert plan.solo_variants == len(VARIANTS)
    with caplog.at_level(logging.INFO, logger="mlx_nursery.engine"):
        warm_up(model, plan, cache_factory(None), kv_quantized=False)
    phases = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up ")]
    # The fast path's common variants first, the batches, then its rarer variants: where the
    # budget runs out, what most requests need is built.
    assert [p.split(" (")[0] for p in phases] == [
        "warm-up 1/6: the fast path",
        "warm-up 2/6: a batch of 2",
        "warm-up 3/6: a batch of 3",
        "warm-up 4/6: a batch of 4",
        "warm-up 5/6: a batch of 6",
        "warm-up 6/6: the fast path's other sampling",
    ]
    assert not any("skipped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_warms_verify_steps_on_the_fast_path_and_in_a_batch(
    tiny_model: Path, caplog: pytest.LogCaptureFixture, method: str
) -> None:
    """With speculative decoding on, a phase of its own runs verify steps of every draft
    length, alone and in a batch (prompt lookup finds drafts in its repeating prompts; a
    draft model always drafts), after the batches."""
    import attrs

    from mlx_nursery.engine import Speculation
    from mlx_nursery.engine._config import EngineConfig
    from mlx_nursery.engine._draft_model import with_draft_model

    draft = str(tiny_model) if method == "draft" else None
    speculation = Speculation(method, tokens=5, draft_model=draft)
    config = EngineConfig(tiny_model, speculation=speculation)
    model = with_draft_model(load_model(tiny_model), config)
    plan = attrs.evolve(
        WarmupPlan(batch_sizes=(2, 3), solo_variants=1, prefill_step_size=16, prefill_batch_size=2),
        speculation=speculation,
    )
    with caplog.at_level(logging.INFO, logger="mlx_nursery.engine"):
        warm_up(model, plan, cache_factory(None), kv_quantized=False)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("warm-up 4/4: speculation's verify steps") for m in messages)
    (verifies,) = [m for m in messages if m.startswith("warm-up: verify steps: ")]
    counts, lengths = verifies.split("; drafts a step: ")
    solo, batched = (int(w) for w in counts.split() if w.isdigit())
    assert solo >= 5 and batched >= 10  # a batch's verify counts once per drafting row
    every = ", ".join(map(str, range(1, 6)))
    # Every length's shapes, alone and in a batch (the adaptive control tries short ones first).
    assert lengths == f"{every} on the fast path; {every} on a batch"


def test_a_budget_spent_during_the_verify_phase_stops_its_longer_lengths(
    tiny_model: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verify phase runs one warm-up per draft length and path: past the budget each
    path stops after its current length (the shortest first: the adaptive control's first
    tries), rather than run them all (up to `--speculative-tokens`, each with its prefill).
    The warm-up's clock is a count of its runs, a second each."""
    import types

    import attrs

    from mlx_nursery.engine import Speculation, _warmup

    clock = [0.0]
    monkeypatch.setattr(_warmup, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    run = _warmup._run

    def counted(*args: object, **kwargs: object) -> None:
        run(*args, **kwargs)  # type: ignore[arg-type]
        clock[0] += 1.0

    monkeypatch.setattr(_warmup, "_run", counted)
    plan = attrs.evolve(
        WarmupPlan(batch_sizes=(2,), solo_variants=1, prefill_step_size=16, prefill_batch_size=2),
        speculation=Speculation(tokens=6),
        budget_s=2.5,  # the fast path and the batch of 2 take 2 s: the verify phase starts
    )
    with caplog.at_level(logging.INFO, logger="mlx_nursery.engine"):
        warm_up(load_model(tiny_model), plan, cache_factory(None), kv_quantized=False)
    (verifies,) = [r.getMessage() for r in caplog.records if "drafts a step: " in r.getMessage()]
    assert verifies.endswith("drafts a step: 1 on the fast path; 1 on a batch")


def test_a_spent_budget_skips_the_remaining_phases(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = load_model(tiny_model)
    plan = WarmupPlan(
        batch_sizes=(2, 3),
        solo_variants=1,
        prefill_step_size=16,
        prefill_batch_size=2,
        budget_s=0.0,
    )
    with caplog.at_level(logging.INFO, logger="mlx_nursery.engine"):
        warm_up(model, plan, cache_factory(None), kv_quantized=False)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("warm-up 1/3: the fast path") for m in messages)
    assert not any(m.startswith("warm-up 2/3") for m in messages)
    assert any("2 of 3 phases skipped" in m for m in messages)


def test_compiled_kernels_are_kept_in_the_users_cache_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlx.core as mx

    from mlx_nursery.engine._backend import keep_compiled_kernels

    monkeypatch.delenv("MLX_PTX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    keep_compiled_kernels()
    kept = Path(os.environ["MLX_PTX_CACHE_DIR"])
    assert kept == tmp_path / "cache" / "mlx-nursery" / "cuda-kernels" / mx.__version__
    assert kept.is_dir()

    monkeypatch.setenv("MLX_PTX_CACHE_DIR", "/operator/choice")
    keep_compiled_kernels()
    assert os.environ["MLX_PTX_CACHE_DIR"] == "/operator/choice"

    # A cache directory that cannot be made: MLX's own default stays.
    monkeypatch.delenv("MLX_PTX_CACHE_DIR")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    keep_compiled_kernels()
    assert "MLX_PTX_CACHE_DIR" not in os.environ


def test_the_smallest_batch_decodes_a_prompt_long_enough_to_split_its_keys(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA a few rows with long keys take the decode attention's two-kernel form
    (slices, then their combination), which MLX compiles at each start: the smallest batch
    runs a prompt that long, so that a lone long request does not wait for the compile."""
    from mlx_nursery.engine import _warmup
    from mlx_nursery.engine._decode_attention import key_slices

    runs: list[tuple[int, int]] = []
    run = _warmup._run

    def recorded(stepper: object, sequences: list[object], *, keep_one: bool) -> None:
        lengths = [len(s.request.prompt_tokens) for s in sequences]  # type: ignore[attr-defined]
        runs.append((len(lengths), max(lengths)))
        run(stepper, sequences, keep_one=keep_one)  # type: ignore[arg-type]

    monkeypatch.setattr(_warmup, "_run", recorded)
    plan = WarmupPlan(
        batch_sizes=(2, 3),
        solo_variants=1,
        prefill_step_size=16,
        prefill_batch_size=2,
        long_prompt=True,  # as `plan_for` gives it where the ragged kernel runs (CUDA)
    )
    warm_up(load_model(tiny_model), plan, cache_factory(None), kv_quantized=False)
    (first_rows, first_longest), (rows, longest) = runs[-2:]
    assert first_rows == 2 and key_slices(first_rows, 8, first_longest) > 1
    assert rows == 3 and longest < _warmup.LONG_PROMPT_TOKENS  # one long prompt is enough
