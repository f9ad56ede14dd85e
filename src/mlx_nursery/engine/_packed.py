"""A decode step and a prefill chunk in one forward: the running rows' next tokens and the
prompt batch's chunk share every per-token part of the model.

Beside a decoding batch, a prefill chunk used to be a forward of its own after the decode
step: the same layers launched twice, and every weight read twice, once for the decode
step's few rows and once for the chunk. In a transformer only attention mixes tokens; the
norms, the projections inside attention aside, the MLP and the residual adds treat each token
alone. So the decode rows' tokens and the chunk's tokens are laid side by side in one
sequence of a batch of one, and each layer runs its norms, its q/k/v and output projections,
its MLP and its residual adds once over all of them; between the projections, each part's
heads go through RoPE, their cache and attention apart, with their own mask (the decode rows
on the running batch's cache, which takes `_decode_attention`'s kernel on CUDA; the chunk on
the prompt batch's cache), exactly as each forward ran them alone. So a chunk step reads each
weight once and launches each matmul once.

The layer's body is read from mlx-lm's (`x + attn(norm(x))`, then `h + mlp(norm(h))`), for
the model types whose layers are written that way and whose output head `_first_tokens`
splits off (`packable`); any other model runs the two forwards apart. The attention's inside
is read from mlx-lm's `Attention` of those modules (`_ATTENTION_READ`: projections, Qwen3's
q/k norms, RoPE at the cache's offset, the module's attention function, which
`_decode_attention.install` routes); another attention class runs whole once per part.
Lazy, like the forwards it replaces; engine thread only.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx

from ._first_tokens import Head, model_head
from ._upstream import create_attention_mask

PACKED_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""mlx-lm model types whose body is `embed_tokens`, then layers of `input_layernorm`,
`self_attn`, `post_attention_layernorm` and `mlp` in the order `layer` below reads, then
`norm` (mlx-lm 0.32.2; tests/engine/test_packed.py compares the packed forward with the
two forwards it replaces)."""

_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")

_ATTENTION_READ = frozenset(f"mlx_lm.models.{name}" for name in ("llama", "qwen2", "qwen3"))
"""Modules whose `Attention.__call__` `_attend` reads (mlx-lm 0.32.2; Mistral is llama's)."""

_ATTENTION_PARTS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "rope",
    "n_heads",
    "n_kv_heads",
    "scale",
)
"""What `_attend` reads of such an `Attention`."""

Part = tuple[int, int, Any, Any]
"""One part of a packed sequence: (rows, length, the part's layer cache, its mask)."""


def packable(model: Any) -> bool:
    """Whether `model`'s decode steps can carry a prefill chunk (module docstring): a listed
    architecture, with no sliding-window layers (their masks differ per layer)."""
    args = getattr(model, "args", None)
    if getattr(args, "model_type", None) not in PACKED_ARCHITECTURES:
        return False
    if model_head(model) is None:
        return False
    body = getattr(model, "model", None)
    if body is None or not all(hasattr(body, part) for part in ("embed_tokens", "layers", "norm")):
        return False
    return all(
        all(hasattr(layer, part) for part in _LAYER_PARTS)
        and not getattr(layer, "use_sliding", False)
        for layer in body.layers
    )


class PackedForward:
    """Called as the running batch's model for one decode step (mlx-lm's `GenerationBatch`
    calls `model(inputs, cache=...)`): runs that step with `chunk` (the prompt batch's
    padded tokens, batch by length) on `chunk_cache`, returns the decode rows' logits and
    keeps the chunk's hidden states (after the final norm) in `chunk_hidden`."""

    def __init__(self, model: Any, head: Head, chunk: mx.array, chunk_cache: list[Any]) -> None:
        """`head`: `model`'s output head (`_first_tokens.model_head`)."""
        self._model = model
        self._head = head
        self._chunk = chunk
        self._chunk_cache = chunk_cache
        self.chunk_hidden: mx.array | None = None

    def __call__(self, inputs: mx.array, cache: list[Any]) -> mx.array:
        decode_hidden, self.chunk_hidden = packed_body(
            self._model, inputs, cache, self._chunk, self._chunk_cache
        )
        logits: mx.array = self._head(decode_hidden)
        return logits


def packed_body(
    model: Any,
    decode_inputs: mx.array,
    decode_cache: list[Any],
    chunk_inputs: mx.array,
    chunk_cache: list[Any],
) -> tuple[mx.array, mx.array]:
    """The model's body (`model.model`) over `decode_inputs` (rows, 1) on `decode_cache` and
    `chunk_inputs` (rows, length) on `chunk_cache` in one pass: the hidden states after the
    final norm, (rows, 1, hidden) and (rows, length, hidden). Both caches are updated as
    the two forwards would update them."""
    body = model.model
    decode_rows, decode_length = decode_inputs.shape
    chunk_rows, chunk_length = chunk_inputs.shape
    split = decode_rows * decode_length
    tokens = mx.concatenate([decode_inputs.reshape(-1), chunk_inputs.reshape(-1)])[None]
    h = body.embed_tokens(tokens)
    width = h.shape[-1]

    def parts(x: mx.array) -> tuple[mx.array, mx.array]:
        return (
            x[:, :split].reshape(decode_rows, decode_length, width),
            x[:, split:].reshape(chunk_rows, chunk_length, width),
        )

    decode_h, chunk_h = parts(h)
    decode_mask = create_attention_mask(decode_h, decode_cache[0])
    chunk_mask = create_attention_mask(chunk_h, chunk_cache[0])
    for layer, decode_layer_cache, chunk_layer_cache in zip(
        body.layers, decode_cache, chunk_cache, strict=True
    ):
        x = layer.input_layernorm(h)
        attention = layer.self_attn
        if _reads(attention):
            r = _attend(
                attention,
                x,
                [
                    (decode_rows, decode_length, decode_layer_cache, decode_mask),
                    (chunk_rows, chunk_length, chunk_layer_cache, chunk_mask),
                ],
            )
        else:
            decode_x, chunk_x = parts(x)
            decode_r = attention(decode_x, decode_mask, decode_layer_cache)
            chunk_r = attention(chunk_x, chunk_mask, chunk_layer_cache)
            r = mx.concatenate(
                [decode_r.reshape(1, split, width), chunk_r.reshape(1, -1, width)], axis=1
            )
        h = h + r
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return parts(body.norm(h))


def _reads(attention: Any) -> bool:
    """`attention` is an mlx-lm `Attention` whose call `_attend` reproduces."""
    kind = type(attention)
    return (
        kind.__name__ == "Attention"
        and kind.__module__ in _ATTENTION_READ
        and all(hasattr(attention, name) for name in _ATTENTION_PARTS)
    )


def _attend(attention: Any, x: mx.array, parts: list[Part]) -> mx.array:
    """mlx-lm's `Attention.__call__` over a packed `x` (1, tokens, hidden): the projections
    once for all tokens, each part's heads through RoPE, its cache and attention on its own."""
    queries, keys, values = attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)
    attend = sys.modules[type(attention).__module__].scaled_dot_product_attention
    q_norm = getattr(attention, "q_norm", None)
    k_norm = getattr(attention, "k_norm", None)
    outputs = []
    start = 0
    for rows, length, cache, mask in parts:
        end = start + rows * length
        q = queries[:, start:end].reshape(rows, length, attention.n_heads, -1)
        k = keys[:, start:end].reshape(rows, length, attention.n_kv_heads, -1)
        v = values[:, start:end].reshape(rows, length, attention.n_kv_heads, -1)
        if q_norm is not None and k_norm is not None:  # Qwen3
            q, k = q_norm(q), k_norm(k)
        q, k, v = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        q = attention.rope(q, offset=cache.offset)
        k = attention.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = attend(q, k, v, cache=cache, scale=attention.scale, mask=mask)
        outputs.append(out.transpose(0, 2, 1, 3).reshape(1, rows * length, -1))
        start = end
    projected: mx.array = attention.o_proj(mx.concatenate(outputs, axis=1))
    return projected
