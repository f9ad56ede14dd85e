"""Make a draft model that agrees with its target: the measurement of what speculative
decoding gains where drafts are accepted, on random-weight models at real shapes.

A random-weight target (`make-model --preset llama-3.1-8b`) and a random draft model never
agree, so a draft model's gain cannot be measured with them. This rewrites the target in
place so that a cheap draft agrees with it, and writes that draft:

  - the target: every layer from `--layers N` on gets its attention output projection
    (`o_proj`) and MLP down projection (`down_proj`) set to zeros (bias and quantization
    scales and biases too). Those are the only two writes a Llama-style layer makes to the
    residual stream, so each such layer adds exactly zero and the target's logits are those
    of its first N layers under its final norm and head. The layers still compute every
    matmul (attention, the projections, the MLP) on real inputs: a step's cost, its shapes
    and the KV cache are a full model's.
  - the draft (`DRAFT`): the target's first N layers, its embeddings, final norm and head,
    its tokenizer files, and its config with `num_hidden_layers` = N: the same function as
    the target, so greedy drafts are accepted unless a different kernel (a verify's several
    positions against the draft's one) rounds a near-tie the other way.

What is synthetic is only the agreement: the target costs what the full model costs, and the
draft what N of its layers and its head cost (for Llama-3.1-8B and N=2, somewhat fewer
weight bytes a step than a Llama-3.2-1B). Acceptance is near 1, the best case, which a
real pair reaches only on text its draft predicts well.

Shards are processed one at a time (an 8B model is never held in memory whole); only the
shards holding a zeroed tensor are rewritten (through a temporary file, then renamed).
The target's config records `mlx_nursery_agreeing_layers`.

Usage:
  python -P bench/agreeing_draft.py /tmp/l8a /tmp/l8a-draft --layers 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import mlx.core as mx

from mlx_nursery.models._kv_layout import _header

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_PARAM = r"(weight|bias|scales|biases)"
_ZEROED = re.compile(rf"^(self_attn\.o_proj|mlp\.down_proj)\.{_PARAM}$")
_KEPT = re.compile(
    rf"^(input_layernorm|post_attention_layernorm|self_attn\.(q|k|v)_proj"
    rf"|self_attn\.(q|k)_norm|mlp\.(gate|up)_proj)\.{_PARAM}$"
)
"""A Llama-style layer's tensors: only `_ZEROED` write to the residual stream. A layer with
any other tensor (a post-MLP norm, experts, a fused projection) is refused: zeroing these two
might not make it add zero."""
_SKIPPED_FILES = {"config.json", "model.safetensors.index.json"}
_STAGED = ".staged.safetensors"
MARKER = "mlx_nursery_agreeing_layers"


def _keys(shard: Path) -> list[str]:
    """The tensor names in a safetensors file, read from its header (no tensor is read)."""
    return [k for k in _header(shard) if k != "__metadata__"]


def _shards(model: Path) -> list[Path]:
    index = model / "model.safetensors.index.json"
    if index.is_file():
        names = set(json.loads(index.read_text())["weight_map"].values())
        return [model / n for n in sorted(names)]
    shards = sorted(s for s in model.glob("*.safetensors") if not s.name.endswith(_STAGED))
    if not shards:
        raise SystemExit(f"{model}: no safetensors weights")
    return shards


def _layer(key: str) -> tuple[int, str] | None:
    match = _LAYER.match(key)
    return (int(match[1]), match[2]) if match else None


def _check(keys: list[str], layers: int, total: int) -> None:
    """Refuse a model whose layers from `layers` on would not add zero once zeroed."""
    zeroed: dict[int, set[str]] = {i: set() for i in range(layers, total)}
    for key in keys:
        found = _layer(key)
        if found is None or found[0] < layers:
            continue
        index, rest = found
        if _ZEROED.match(rest):
            zeroed[index].add(rest.split(".")[1])
        elif not _KEPT.match(rest):
            raise SystemExit(f"{key}: not a Llama-style layer's tensor; refusing this model")
    missing = [i for i, names in zeroed.items() if names != {"o_proj", "down_proj"}]
    if missing:
        raise SystemExit(f"layers {missing} lack an o_proj or a down_proj weight; refusing")


def make_agreeing_draft(target: Path, draft: Path, layers: int) -> dict[str, Any]:
    """Zero the target's layers from `layers` on (in place) and write the draft; returns
    what was done."""
    config: dict[str, Any] = json.loads((target / "config.json").read_text())
    total = int(config["num_hidden_layers"])
    if not 0 < layers < total:
        raise SystemExit(f"--layers must be between 1 and {total - 1}")
    shards = {shard: _keys(shard) for shard in _shards(target)}
    _check([k for keys in shards.values() for k in keys], layers, total)

    def zeroed(key: str) -> bool:
        found = _layer(key)
        return found is not None and found[0] >= layers and bool(_ZEROED.match(found[1]))

    def drafted(key: str) -> bool:
        found = _layer(key)
        return found is None or found[0] < layers

    draft.mkdir(parents=True, exist_ok=True)
    for old in draft.glob("*.safetensors"):
        old.unlink()
    sources = [s for s, keys in shards.items() if any(drafted(k) for k in keys)]
    names = {
        shard: "model.safetensors"
        if len(sources) == 1
        else f"model-{at:05d}-of-{len(sources):05d}.safetensors"
        for at, shard in enumerate(sources, start=1)
    }
    weight_map: dict[str, str] = {}
    rewritten = []
    for shard, keys in shards.items():
        name = names.get(shard)
        if name is not None:
            weight_map.update(dict.fromkeys(filter(drafted, keys), name))
        if any(zeroed(k) for k in keys):
            rewritten.append(shard.name)
        if name is not None or shard.name in rewritten:
            _rewrite(shard, draft / name if name else None, zeroed, drafted)
    if len(sources) > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (draft / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for item in target.iterdir():
        if item.suffix == ".safetensors" or item.name in _SKIPPED_FILES:
            continue
        if item.is_dir():
            shutil.copytree(item, draft / item.name, dirs_exist_ok=True)
        else:
            shutil.copy2(item, draft / item.name)
    draft_config = {k: v for k, v in config.items() if k != MARKER}
    draft_config["num_hidden_layers"] = layers
    if isinstance(config.get("layer_types"), list):
        draft_config["layer_types"] = config["layer_types"][:layers]
    (draft / "config.json").write_text(json.dumps(draft_config, indent=2, sort_keys=True))
    config[MARKER] = min(layers, int(config.get(MARKER, layers)))
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return {"rewritten": rewritten, "draft_tensors": len(weight_map), "layers": layers}


def _rewrite(
    shard: Path, draft: Path | None, zeroed: Callable[[str], bool], drafted: Callable[[str], bool]
) -> None:
    """One shard: its draft tensors to `draft`, and itself rewritten with its zeroed tensors
    (through a temporary file) if it holds any. Only this shard is in memory."""
    # A safetensors file with its metadata: its tensors by name, and string metadata.
    arrays, metadata = cast(
        tuple[dict[str, mx.array], dict[str, str]],
        mx.load(str(shard), return_metadata=True),
    )
    if draft is not None:
        part = {k: v for k, v in arrays.items() if drafted(k)}
        mx.save_safetensors(str(draft), part, metadata=metadata)
    if any(zeroed(k) for k in arrays):
        out = {k: mx.zeros_like(v) if zeroed(k) else v for k, v in arrays.items()}
        staged = shard.with_name(shard.stem + _STAGED)  # MLX appends .safetensors
        mx.save_safetensors(str(staged), out, metadata=metadata)
        os.replace(staged, shard)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", type=Path, help="a model directory, rewritten in place")
    parser.add_argument("draft", type=Path, help="where the draft model is written")
    parser.add_argument("--layers", type=int, default=2, help="the layers both keep (N)")
    args = parser.parse_args()
    done = make_agreeing_draft(args.target, args.draft, args.layers)
    print(f"zeroed layers {args.layers}.. of {args.target} in {', '.join(done['rewritten'])}")
    print(
        f"wrote the draft ({done['draft_tensors']} tensors, {args.layers} layers) to {args.draft}"
    )
