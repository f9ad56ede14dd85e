"""Cross-encoders load as rerankers, BERT's and XLM-RoBERTa's heads give the checkpoint's
logits (computed apart, `tests/scoring_helpers.py`), and a head that is not a reranker's is
refused rather than served as something else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_nursery.models import ModelLoadError, load_model, model_facts
from mlx_nursery.tools import make_model
from tests.scoring_helpers import direct_logits

PAIRS = [("what is the answer", "the answer is one"), ("a", "the the of and to in is you")]


def logits(model: Path) -> list[float]:
    loaded = load_model(model)
    backend = loaded.tokenizer.backend_tokenizer  # type: ignore[union-attr]
    spec = loaded.embedding
    assert loaded.kind == "reranker" and spec is not None and spec.classifier is not None
    out = []
    for query, document in PAIRS:
        pair = backend.encode(query, document)
        ids = mx.array([pair.ids])
        types = mx.array([pair.type_ids]) if spec.classifier.token_types else None
        assert loaded.model is not None
        out.append(float(loaded.model(ids, mx.ones_like(ids), types)[0, 0]))
    return out


@pytest.mark.parametrize("preset", ["tiny-reranker", "tiny-reranker-xlmr"])
def test_a_cross_encoder_loads_as_a_reranker_with_the_checkpoints_logits(
    preset: str, tmp_path: Path, tiny_reranker: Path
) -> None:
    model = tiny_reranker if preset == "tiny-reranker" else make_model(tmp_path / preset, preset)
    facts = model_facts(model)
    assert facts.kind == "reranker"
    got = logits(model)
    np.testing.assert_allclose(got, direct_logits(model, PAIRS), atol=1e-4)
    assert got[0] != pytest.approx(got[1])  # a random head still tells the pairs apart
    spec = load_model(model).embedding
    assert spec is not None and spec.classifier is not None
    # BERT tells a pair's texts apart by token type; RoBERTa has one type
    assert spec.classifier.token_types is (preset == "tiny-reranker")
    assert spec.classifier.activation == "sigmoid"
    # XLM-RoBERTa's positions start after the padding id: two fewer than its table holds
    assert spec.context_length == 128
    assert model_facts(model).context_length == 128


def test_a_head_that_is_not_a_rerankers_is_refused(tiny_reranker: Path, tmp_path: Path) -> None:
    def variant(name: str, **changes: object) -> Path:
        out = tmp_path / name
        shutil.copytree(tiny_reranker, out)
        config = json.loads((out / "config.json").read_text())
        config.update(changes)
        (out / "config.json").write_text(json.dumps(config))
        return out

    two_labels = variant("two", id2label={"0": "no", "1": "yes"})
    modern = variant("modern", model_type="modernbert")
    tanh = variant("tanh", sentence_transformers={"activation_fn": "torch.nn.Tanh"})
    identity = variant(
        "identity", sentence_transformers={"activation_fn": "torch.nn.modules.linear.Identity"}
    )
    for refused, says in ((two_labels, "2 labels"), (modern, "modernbert"), (tanh, "Tanh")):
        assert model_facts(refused).kind == "reranker"  # never served as an embedding model
        with pytest.raises(ModelLoadError, match=says):
            load_model(refused)
    spec = load_model(identity).embedding
    assert spec is not None and spec.classifier is not None
    assert spec.classifier.activation == "identity"
