"""A cross-encoder's scores computed directly, apart from the server's code: Hugging Face's
tokenizer frames each pair, mlx-embeddings' encoder reads it, the head's weights are applied
with NumPy as the checkpoint's files hold them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from transformers import AutoTokenizer


def direct_logits(model: Path, pairs: list[tuple[str, str]], **tokenizing: Any) -> list[float]:
    """Each pair's logit: `tokenizing` goes to the tokenizer's call (e.g. truncation)."""
    from mlx_embeddings.models import bert, xlm_roberta

    config = json.loads((model / "config.json").read_text())
    weights: dict[str, mx.array] = mx.load(str(model / "model.safetensors"))  # type: ignore[assignment]
    roberta = config["model_type"] == "xlm-roberta"
    prefix = "roberta." if roberta else "bert."
    if roberta:
        encoder: Any = xlm_roberta.Model(
            xlm_roberta.ModelArgs.from_dict({**config, "add_pooling_layer": False})
        )
    else:
        encoder = bert.Model(bert.ModelArgs.from_dict(config))
    encoder.load_weights(
        [(k[len(prefix) :], v) for k, v in weights.items() if k.startswith(prefix)]
    )
    encoder.eval()
    head = {
        k: np.array(v, dtype=np.float64) for k, v in weights.items() if k.startswith("classifier")
    }
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    logits: list[float] = []
    for query, document in pairs:
        framed = tokenizer(query, document, return_token_type_ids=True, **tokenizing)
        ids = mx.array([framed["input_ids"]])
        types = mx.array([framed["token_type_ids"]]) if not roberta else None
        out = encoder(ids, token_type_ids=types, attention_mask=mx.ones_like(ids))
        if roberta:
            first = np.array(out.last_hidden_state[0, 0], dtype=np.float64)
            hidden = np.tanh(
                head["classifier.dense.weight"] @ first + head["classifier.dense.bias"]
            )
            logit = head["classifier.out_proj.weight"] @ hidden + head["classifier.out_proj.bias"]
        else:
            pooled = np.array(out.pooler_output[0], dtype=np.float64)
            logit = head["classifier.weight"] @ pooled + head["classifier.bias"]
        logits.append(float(logit[0]))
    return logits


def sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit))
