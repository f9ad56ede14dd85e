"""LoRA adapters served per request: many adapters on one loaded base model, batched.

Each adapted projection of the base model (a `Linear` or `QuantizedLinear` an adapter names)
is replaced, once, by a `MultiLoRALinear` that holds every loaded adapter's matrices for it
stacked by *slot*: `a` is (slots, in, rank), `b` is (slots, rank, out), `scales` (slots,).
Slot 0 is the base model: all zeros. A forward adds, for each row r of the batch,
`scale[s_r] * (x_r @ a[s_r]) @ b[s_r]` to the base projection, `s_r` being the row's slot:
the slots are gathered by one index array and the two products are batched matmuls, so rows
of the base and of different adapters run in one forward. Adapters of different ranks are
zero-padded to the largest (zero columns of `a` and rows of `b` add nothing); a projection
an adapter does not touch holds zeros in its slot.

On a model whose q/k/v and gate/up projections were fused at load (`_fusing`), an adapted
projection wraps its `FusedPart`: the group's one matmul runs as without adapters, and the
part adds its rows' deltas to its slice, so serving adapters keeps the fusion's saving.

Which slot each row uses is the bank's `AdapterRows`, which the engine's steppers set around
each forward they launch (`AdapterRows.use`), from the uids of the rows run: a decode step's
running batch, a prefill chunk's prompt batch, the fast path's one row. It is None outside
such a block, and then the adapters add nothing: warm-up and any forward the steppers do not
mark run the base model. The index array is read while the forward's graph is built, so a
block need only cover the Python call of the model, not its evaluation.

Everything here makes MLX calls: the engine thread only. The stacked arrays are not in the
model's parameter tree (plain attributes), so the model's weights count as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.quantized import QuantizedLinear
from mlx.utils import tree_unflatten

from ._fusing import FusedPart, linear_dims

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapters.safetensors"


class AdapterError(ValueError):
    """An adapter that cannot be served on this model (missing files, another fine-tune
    type, matrices that do not fit the base's projections)."""


class AdapterRows:
    """The slots of the rows of the forward being built (None: every row is the base's)."""

    def __init__(self) -> None:
        self.current: mx.array | None = None

    @contextmanager
    def use(self, slots: Sequence[int]) -> Iterator[None]:
        """Rows `slots` (in batch order) for the forwards built inside the block; a block of
        base rows alone leaves the adapters out entirely. Not reentrant."""
        self.current = mx.array(list(slots), dtype=mx.int32) if any(slots) else None
        try:
            yield
        finally:
            self.current = None


class MultiLoRALinear(Module):
    """A base projection plus each row's adapter (this module's docstring)."""

    def __init__(self, base: Module, rows: AdapterRows, slots: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.linear = base
        self._rows = rows
        out_dims, in_dims = _dims(base)
        self._a = mx.zeros((slots, in_dims, 1))
        self._b = mx.zeros((slots, 1, out_dims))
        self._scales = mx.zeros((slots,))

    @property
    def rank(self) -> int:
        return int(self._a.shape[2])

    @property
    def slot_bytes(self) -> int:
        """What one slot holds here (its padded matrices and its scale)."""
        _, in_dims, rank = self._a.shape
        out_dims = self._b.shape[2]
        return (in_dims * rank + rank * out_dims + 1) * self._a.itemsize

    def __call__(self, x: mx.array) -> mx.array:
        y: mx.array = self.linear(x)
        slots = self._rows.current
        if slots is None:
            return y
        if slots.shape[0] != x.shape[0]:
            raise RuntimeError(f"{slots.shape[0]} adapter rows for a batch of {x.shape[0]}")
        a, b = self._a[slots], self._b[slots]
        z = (x.astype(a.dtype) @ a) @ b
        scale = self._scales[slots].reshape((-1,) + (1,) * (z.ndim - 1))
        return y + (scale * z).astype(y.dtype)

    def resize(self, slots: int, rank: int) -> None:
        """Room for `slots` slots of rank `rank` at least (new room is zeros)."""
        s, _, r = self._a.shape
        if slots > s or rank > r:
            grow_s, grow_r = max(slots - s, 0), max(rank - r, 0)
            self._a = mx.pad(self._a, [(0, grow_s), (0, 0), (0, grow_r)])
            self._b = mx.pad(self._b, [(0, grow_s), (0, grow_r), (0, 0)])
            self._scales = mx.pad(self._scales, [(0, grow_s)])
            mx.eval(self._a, self._b, self._scales)

    def put(self, slot: int, a: mx.array, b: mx.array, scale: float) -> None:
        """Slot `slot` becomes `scale * a @ b` ((in, r), (r, out)): zeros past rank r."""
        rank = int(a.shape[1])
        self.resize(slot + 1, rank)
        pad = self.rank - rank
        self._a[slot] = mx.pad(a.astype(self._a.dtype), [(0, 0), (0, pad)])
        self._b[slot] = mx.pad(b.astype(self._b.dtype), [(0, pad), (0, 0)])
        self._scales[slot] = scale
        mx.eval(self._a, self._b, self._scales)

    def zero(self, slot: int) -> None:
        if slot < self._a.shape[0]:
            self._a[slot] = 0
            self._b[slot] = 0
            self._scales[slot] = 0
            mx.eval(self._a, self._b, self._scales)


def _dims(projection: Module) -> tuple[int, int]:
    """(out, in) of a projection: a `Linear`, `QuantizedLinear`, or a fused group's part."""
    return projection.dims if isinstance(projection, FusedPart) else linear_dims(projection)


@attrs.frozen
class Adapter:
    """An adapter read from its directory: per projection path, its (a, b) matrices."""

    scale: float
    rank: int
    matrices: dict[str, tuple[mx.array, mx.array]]


def read_adapter(path: str | Path) -> Adapter:
    """Read an mlx-lm LoRA adapter directory (`adapter_config.json`, `adapters.safetensors`
    of `...lora_a` / `...lora_b` arrays). Raises AdapterError."""
    folder = Path(path).expanduser()
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text("utf-8"))
        weights = mx.load(str(folder / ADAPTER_WEIGHTS))
    except (OSError, ValueError, RuntimeError) as exc:
        raise AdapterError(f"cannot read the adapter at {folder}: {exc}") from exc
    if config.get("fine_tune_type", "lora") != "lora":
        raise AdapterError(f"only LoRA adapters are served, not {config.get('fine_tune_type')!r}")
    if not isinstance(weights, dict):
        raise AdapterError("the adapter's weights are not a dictionary of arrays")
    parameters = config.get("lora_parameters") or {}
    scale = float(parameters.get("scale", 20.0))
    matrices: dict[str, tuple[mx.array, mx.array]] = {}
    for name, a in weights.items():
        if not name.endswith(".lora_a"):
            continue
        module = name.removesuffix(".lora_a")
        b = weights.get(f"{module}.lora_b")
        if b is None or a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise AdapterError(f"the adapter's matrices for {module} do not pair up")
        matrices[module] = (a, b)
    if not matrices or len(matrices) * 2 != len(weights):
        raise AdapterError("the adapter holds no LoRA pairs, or arrays that are not LoRA's")
    rank = max(int(a.shape[1]) for a, _ in matrices.values())
    return Adapter(scale, rank, matrices)


class AdapterBank:
    """The adapters loaded on one base model, each in a slot of every `MultiLoRALinear`.

    A freed slot is reused by the next adapter loaded. Engine thread only."""

    def __init__(self, model: Module) -> None:
        self._model = model
        self.rows = AdapterRows()
        self._layers: dict[str, MultiLoRALinear] = {}
        self._slots: dict[str, int] = {}
        self._loads: dict[str, int] = {}
        self._loaded = 0
        self._capacity = 1
        """Slots every layer has room for: past the highest slot ever used, so that no
        gather of a row's slot reads past any layer's stack."""

    def slot_of(self, name: str | None) -> int:
        """The slot of adapter `name` (0: the base, for None). Raises KeyError if not loaded."""
        return 0 if name is None else self._slots[name]

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def nbytes(self, name: str) -> int:
        """What adapter `name` holds now: a slot of every adapted layer (each slot spans
        every layer, padded to the largest rank loaded, in float32). Raises KeyError."""
        if name not in self._slots:
            raise KeyError(name)
        return sum(layer.slot_bytes for layer in self._layers.values())

    def load_id(self, name: str) -> int:
        """Which load of `name` is in its slot (another after an unload and a load): what
        the prefix cache keys its KV by, so that no KV of an earlier adapter is reused (-1:
        not loaded)."""
        return self._loads.get(name, -1)

    def load(self, name: str, path: str | Path) -> int:
        """Load the adapter at `path` as `name` (replacing one of that name); its bytes."""
        adapter = read_adapter(path)
        modules = dict(self._model.named_modules())  # type: ignore[no-untyped-call]
        for module in adapter.matrices:
            found = modules.get(module)
            if not isinstance(found, (Linear, QuantizedLinear, FusedPart, MultiLoRALinear)):
                raise AdapterError(f"the base model has no projection {module} to adapt")
            base = found.linear if isinstance(found, MultiLoRALinear) else found
            a, b = adapter.matrices[module]
            if (int(b.shape[1]), int(a.shape[0])) != _dims(base):
                raise AdapterError(f"the adapter's {module} does not fit the base's shape")
        if name in self._slots:
            self.unload(name)
        used = set(self._slots.values())
        slot = next(s for s in range(1, len(used) + 2) if s not in used)
        self._capacity = max(self._capacity, slot + 1)
        for layer in self._layers.values():  # every layer gathers every row's slot: room
            layer.resize(self._capacity, 1)  # for it, zeros where this adapter adapts nothing
        for module, (a, b) in adapter.matrices.items():
            self._layer(module, modules[module]).put(slot, a, b, adapter.scale)
        self._slots[name] = slot
        self._loaded += 1
        self._loads[name] = self._loaded
        return self.nbytes(name)

    def unload(self, name: str) -> None:
        """Free `name`'s slot (zeros in every layer). Raises KeyError if not loaded."""
        slot = self._slots.pop(name)
        self._loads.pop(name, None)
        for layer in self._layers.values():
            layer.zero(slot)

    def _layer(self, path: str, module: Module) -> MultiLoRALinear:
        layer = self._layers.get(path)
        if layer is None:
            layer = MultiLoRALinear(module, self.rows, self._capacity)
            self._model.update_modules(tree_unflatten([(path, layer)]))
            self._layers[path] = layer
        return layer
