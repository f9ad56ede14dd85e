"""A prompt's first token from its last prefill chunk (`engine/_first_tokens.py`): the split
of the model into body and head is the model, the first tokens are those of mlx-lm's way,
and no forward of its own runs for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models import llama, qwen2
from mlx_lm.sample_utils import make_logits_processors
from mlx_lm.utils import load

from mlx_nursery.engine._first_tokens import model_head
from mlx_nursery.engine._schedule import ServingBatchGenerator
from tests.helpers import small_mlx_lm_model


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Any:
    return load(str(tiny_model))[0]


def _small(module: Any, **overrides: Any) -> Any:
    return small_mlx_lm_model(module, 3, **overrides)


def test_the_head_split_off_is_the_model(model: Any) -> None:
    """Body then head equals the whole model: tied embeddings (the tiny qwen3), an own head
    (llama, qwen2); an architecture not read here has no split."""
    untied = {"tie_word_embeddings": False}
    for candidate in (model, _small(llama, **untied), _small(qwen2, **untied)):
        head = model_head(candidate)
        assert head is not None
        inputs = mx.array([[3, 9, 4, 1, 7]])
        whole = candidate(inputs)
        split = head(candidate.model(inputs))
        assert mx.allclose(whole, split, atol=1e-5).item()

    class Other:
        args = type("Args", (), {"model_type": "gemma3n"})()

    assert model_head(Other()) is None


class _Counting:
    """The model, counting its forwards: whole (`__call__`) or its body alone (`.model`)."""

    def __init__(self, model: Any, counts: list[int] | None = None) -> None:
        self._model = model
        self.counts = [0] if counts is None else counts
        if hasattr(model, "model"):
            self.model = _Counting(model.model, self.counts)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.counts[0] += 1
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    @property
    def forwards(self) -> int:
        return self.counts[0]


def _run(model: Any, fold: bool, prompts: list[list[int]], **insert: Any) -> dict[int, list[int]]:
    generator = ServingBatchGenerator(
        model,
        completion_batch_size=4,
        prefill_batch_size=3,
        prefill_step_size=8,
        fold_first_tokens=fold,
    )
    uids = generator.insert(prompts, max_tokens=[5] * len(prompts), **insert)
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    for _ in range(60):
        for response in generator.next()[1]:
            tokens[response.uid].append(int(response.token))
        if all(len(t) == 5 for t in tokens.values()):
            break
    generator.close()
    return {uids.index(uid): t for uid, t in tokens.items()}


def test_first_tokens_from_the_chunk_equal_mlx_lm_s_and_take_no_forward_of_their_own(
    model: Any,
) -> None:
    """Prompts of mixed lengths (right-padded in one chunk; some whose last token does not
    fit their last chunk and take mlx-lm's way), with a logits processor on one row: the
    same greedy tokens either way, and the folded run skips one forward per group."""
    prompts = [[(5 * i + 3 * j) % 60 + 1 for j in range(n)] for i, n in enumerate((8, 7, 5, 12))]
    processors = [make_logits_processors(repetition_penalty=1.5), [], [], []]
    counted = {fold: _Counting(model) for fold in (True, False)}
    folded = _run(counted[True], True, prompts, logits_processors=processors)
    plain = _run(counted[False], False, prompts, logits_processors=processors)
    assert folded == plain
    assert all(len(t) == 5 for t in folded.values())
    assert counted[True].forwards < counted[False].forwards
