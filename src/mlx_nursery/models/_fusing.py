"""Q/K/V and gate/up projections fused into one matmul each, at load.

Where a decode step is bound by the host launching kernels (CUDA at a few dozen streams),
each matmul launch counts: a layer's query, key and value projections read the same input,
and so do its MLP's gate and up projections. This transform concatenates each group's
weights along the output dimension into one `Linear` (or `QuantizedLinear` of the same group
size, bits and mode; biases too, as Qwen2's q/k/v have) and puts in the old places small
modules that hand out their slice of the one product. mlx-lm's attention and MLP code runs
unchanged around them: RoPE, the KV caches (quantized ones too), attention, Qwen3's and
Gemma3's q/k norms.

How the slices are handed out: the first projection of a group called on an input computes
the fused product and keeps it with that input; the others called on the same input (the
same array object) take their slice; once each has taken its slice, nothing is kept. A
projection called on another input computes the product for it afresh, so any order of
calls stays correct; the architectures fused (`_COVERED`) call a group's projections on one
input, one after the other.

The fused weight replaces the parts in the parameter tree (`qkv_proj`, `gate_up_proj`) and
the part modules hold no arrays, so `parameters()` counts each weight once. A vision model's
language model (mlx-vlm's, which prefills image prompts) holds the same arrays as mlx-lm's
text model: it gets the same fused module, so that the old arrays are freed from both.
"""

from __future__ import annotations

import copy
import logging

import attrs
import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.quantized import QuantizedLinear

log = logging.getLogger("mlx_nursery.models")

_COVERED = frozenset(
    f"mlx_lm.models.{name}"
    for name in ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "ministral3")
)
"""mlx-lm modules whose `Attention` and `MLP` call each group's projections on one input
(Mistral is mlx-lm's llama; Qwen2-VL's, Qwen3-VL's, Gemma 3's and Mistral 3's text models
are these)."""

_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Attention": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "MLP": ("gate_up_proj", ("gate_proj", "up_proj")),
}
"""Per covered class name: the fused module's name, and the projections it replaces."""

_QUANT_ATTRS = ("group_size", "bits", "mode")


@attrs.frozen
class Fusion:
    """What `fuse_projections` did to a model."""

    attention: int
    """Attention blocks whose q/k/v now run as one matmul."""
    mlp: int
    """MLP blocks whose gate/up now run as one matmul."""

    @property
    def fused(self) -> bool:
        return self.attention + self.mlp > 0


class _Shared:
    """One fused group's product, kept for the input it was computed on until every part
    has taken its slice. A plain object: the module tree does not see it (no parameters)."""

    def __init__(self, linear: Module, sizes: list[int]) -> None:
        self.linear = linear
        self.sizes = sizes
        self._splits = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)]
        self._input: mx.array | None = None
        self._outputs: list[mx.array] = []
        self._waiting: set[int] = set()

    def part(self, x: mx.array, index: int) -> mx.array:
        if self._input is not x or index not in self._waiting:
            self._outputs = list(mx.split(self.linear(x), self._splits, axis=-1))
            self._input = x
            self._waiting = set(range(len(self._outputs)))
        self._waiting.discard(index)
        out = self._outputs[index]
        if not self._waiting:
            self._input, self._outputs = None, []
        return out


class FusedPart(Module):
    """Stands where one projection of a fused group was: its slice of the group's product."""

    def __init__(self, shared: _Shared, index: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._shared = shared
        self._index = index

    def __call__(self, x: mx.array) -> mx.array:
        return self._shared.part(x, self._index)

    def group(self, x: mx.array) -> mx.array:
        """The whole group's product of `x`, every part's slice side by side (not kept)."""
        product: mx.array = self._shared.linear(x)
        return product

    @property
    def dims(self) -> tuple[int, int]:
        """(out, in) of the projection this part stands for: its slice of the group."""
        return self._shared.sizes[self._index], linear_dims(self._shared.linear)[1]


def fused_sizes(parts: list[object]) -> list[int] | None:
    """The output sizes of one fused group whose parts are `parts`, in order (each an
    unwrapped `FusedPart` of the same group, its index its place), or None."""
    first = parts[0]
    if not isinstance(first, FusedPart):
        return None
    shared = first._shared
    if len(parts) != len(shared.sizes) or any(
        type(p) is not FusedPart or p._shared is not shared or p._index != i
        for i, p in enumerate(parts)
    ):
        return None
    return list(shared.sizes)


def linear_dims(linear: Module) -> tuple[int, int]:
    """(out, in) of a `Linear` or `QuantizedLinear`."""
    weight = linear.weight
    out_dims = int(weight.shape[0])
    if isinstance(linear, QuantizedLinear):
        return out_dims, int(weight.shape[1]) * 32 // int(linear.bits)
    return out_dims, int(weight.shape[1])


def fuse_projections(model: Module, *, shared_with: Module | None = None) -> Fusion:
    """Fuse the covered blocks' projection groups in `model` (in place) and return what was
    fused. `shared_with`: a second model whose modules at the same paths hold the same
    arrays (a VLM's mlx-vlm language model); a group is fused in both or, where the second
    does not hold the same arrays, in neither (two copies would hold the weights twice).
    A group whose parts differ (kind, input size, quantization, biases) stays as it is.
    Makes MLX calls: the engine thread."""
    # The blocks alone, not every module: the parts' arrays are freed once replaced.
    blocks = [
        (path, block)
        for path, block in _named_modules(model)
        if type(block).__module__ in _COVERED and type(block).__name__ in _GROUPS
    ]
    others: dict[str, Module] = {}
    if shared_with is not None:
        wanted = {path for path, _ in blocks}
        others = {path: m for path, m in _named_modules(shared_with) if path in wanted}
    counts = {"Attention": 0, "MLP": 0}
    for path, block in blocks:
        name, parts = _GROUPS[type(block).__name__]
        other = others.get(path)
        if shared_with is not None and (other is None or not _same_arrays(block, other, parts)):
            continue
        linear = _fused_linear([block[p] for p in parts])
        if linear is None:
            continue
        for target in (block, other):
            if target is not None:
                _install(target, name, parts, linear)
        counts[type(block).__name__] += 1
        mx.clear_cache()  # the parts' buffers, freed now: the peak stays one group over
    fusion = Fusion(attention=counts["Attention"], mlp=counts["MLP"])
    if not fusion.fused:
        log.debug("weights not fused: %s is not a covered architecture", type(model).__module__)
    return fusion


def _named_modules(model: Module) -> list[tuple[str, Module]]:
    found: list[tuple[str, Module]] = model.named_modules()  # type: ignore[no-untyped-call]
    return found


def _fused_linear(parts: list[Module]) -> Module | None:
    """One module computing `parts`' outputs side by side, its arrays evaluated; None when
    the parts cannot be fused."""
    kind = type(parts[0])
    if kind not in (Linear, QuantizedLinear) or any(type(p) is not kind for p in parts):
        return None
    keys = sorted(k for k, value in parts[0].items() if isinstance(value, mx.array))
    for part in parts:
        if sorted(k for k, value in part.items() if isinstance(value, mx.array)) != keys:
            return None
        if any(getattr(part, a, None) != getattr(parts[0], a, None) for a in _QUANT_ATTRS):
            return None
        for key in keys:
            first, this = parts[0][key], part[key]
            if this.dtype != first.dtype or this.shape[1:] != first.shape[1:]:
                return None
    fused = copy.copy(parts[0])
    for key in keys:
        fused[key] = mx.concatenate([part[key] for part in parts], axis=0)
    mx.eval([fused[key] for key in keys])
    return fused


def _same_arrays(block: Module, other: Module, parts: tuple[str, ...]) -> bool:
    for part in parts:
        mine, theirs = block.get(part), other.get(part)
        if not isinstance(mine, Module) or not isinstance(theirs, Module):
            return False
        if set(mine) != set(theirs) or any(mine[k] is not theirs[k] for k in mine):
            return False
    return True


def _install(block: Module, name: str, parts: tuple[str, ...], linear: Module) -> None:
    sizes = [int(block[p]["weight"].shape[0]) for p in parts]
    shared = _Shared(linear, sizes)
    setattr(block, name, linear)
    for index, part in enumerate(parts):
        setattr(block, part, FusedPart(shared, index))
