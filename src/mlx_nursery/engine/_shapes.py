"""The shapes the model is run on: a supported statistic of what traffic asks of a backend
that specialises kernels per shape.

MLX's CUDA backend builds cuDNN attention graphs per (query length, key length) when cuDNN
attention is on (`EngineConfig.cudnn_attention`), and instantiates CUDA graphs per new
structure; Metal mostly does not specialise on lengths. The engine counts the distinct
prefill shapes it has run against the prefill forwards, so that a
benchmark or an operator can see how much of the traffic is new to the backend.
"""

from __future__ import annotations

from typing import Any


def cached_length(cache: Any) -> int | None:
    """Keys a cache holds before the next forward (None: not readable without a device
    sync). mlx-lm's `BatchKVCache` keeps it in `_idx`; `KVCache` in `offset`."""
    if not cache:
        return 0
    layer = cache[0]
    held = getattr(layer, "_idx", None)
    if held is None:
        held = getattr(layer, "offset", None)
    return held if isinstance(held, int) else None


class ShapeWatch:
    """The model as the steppers call it: each prefill forward's (batch, query length, key
    length) is noted on the way through. Everything else is the model's (attribute lookups
    go through), so mlx-lm's batching and cache factories see the model itself."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.unwatched = model
        """The model itself, for forwards that are not prefill (speculation's verify steps)."""
        self._seen: set[tuple[int, int, int | None]] = set()
        """(batch, query length, key length; None where the cache's length is unreadable)."""
        self.prefill_forwards = 0

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self.note(inputs, kwargs.get("cache"))
        return self._model(inputs, *args, **kwargs)

    def note(self, inputs: Any, cache: Any) -> None:
        """Count a forward of `inputs` on `cache` that runs the model's parts rather than the
        model (`_first_tokens`: the body without the head)."""
        if inputs.ndim == 2 and inputs.shape[1] > 1:
            held = cached_length(cache)
            batch, length = inputs.shape
            shape = (batch, length, None if held is None else length + held)
            self.prefill_forwards += 1
            self._seen.add(shape)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    @property
    def shapes(self) -> int:
        return len(self._seen)
