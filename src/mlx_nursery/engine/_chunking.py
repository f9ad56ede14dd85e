"""Prefill chunk sizes from measured time: how many prompt tokens the next chunk may take so
that the sequences decoding beside it wait about `EngineConfig.prefill_chunk_ms` for it.

Each engine iteration runs the running batch's decode step, then one chunk of the prompts
being prefilled (`_schedule.py`), so a running stream waits for that chunk between two of
its tokens. A fixed token count costs very differently by backend and model: what takes
milliseconds on a GPU held a CPU's running streams far longer (issue 29). So the
engine measures what a prefilled token costs (exponential moving averages over the chunks
it runs, updated on the engine thread after each one: `ChunkSizer`) and, while
other sequences decode, gives the next chunk the largest size whose predicted time fits the
budget. A prompt prefilled while nothing decodes is not shrunk: nobody waits for it.

Sizes come from a small fixed set: powers of two from `MIN_CHUNK_TOKENS` up, and
`prefill_step_size` itself, the largest. On CUDA a new query length can build a new graph
(docs/architecture.md, "Shape compiles"), so lengths must not follow the measurements
freely. The size is per prompt: a chunk of several prompts costs rows times length. The
smallest size is given even where it costs more than the budget; until a first prefill
has been measured (a chunk, or a lone prompt's forward with its first token), a chunk
beside decoding sequences gets the smallest size.

The chunk's time as measured includes what is left of the decode step in flight (the
batch's chunk waits for it on the same stream), so the budget bounds roughly the whole gap
a running stream sees: as a step's decode takes more of the budget, chunks get smaller.
"""

from __future__ import annotations

import mlx.core as mx

MIN_CHUNK_TOKENS = 16
"""The smallest chunk beside decoding sequences (unless `prefill_step_size` is smaller)."""

SMOOTHING = 0.3
"""Weight of the newest chunk in the moving averages: a few chunks follow a change of cost
(a longer context, a busier machine); one outlier moves them by less than a third."""

CPU_BUDGET_MS = 250.0
"""The default budget on the CPU: a running stream's gap stays a fraction of a second
where a full-size chunk of a mid-sized model takes many times that (docs/benchmarks.md)."""

GPU_BUDGET_MS = 1000.0
"""The default budget on a GPU (Metal, CUDA): above what a full prompt batch of full-size
chunks costs an 8B model on an H100 (docs/benchmarks.md), so serving there is as before;
a large model on a smaller GPU has its chunks shrunk."""


def budget_ms(configured: float | None) -> float | None:
    """The budget for `EngineConfig.prefill_chunk_ms` (None: no budget): 0 is none, None
    the default of this process's MLX device (engine thread: it asks MLX)."""
    if configured is not None:
        return configured or None
    return CPU_BUDGET_MS if mx.default_device().type == mx.cpu else GPU_BUDGET_MS


def chunk_sizes(largest: int) -> tuple[int, ...]:
    """The sizes a chunk may have, ascending: powers of two from `MIN_CHUNK_TOKENS` below
    `largest`, then `largest`."""
    sizes = []
    size = MIN_CHUNK_TOKENS
    while size < largest:
        sizes.append(size)
        size *= 2
    return (*sizes, largest)


class ChunkSizer:
    """Sizes prefill chunks by a time budget from measured cost per token. Engine thread only.

    The cost per token is a ratio of two moving averages, of chunks' seconds and of their
    tokens, so each chunk weighs by its tokens: a prompt's short last chunk, whose time is
    mostly fixed overhead, barely moves it. `budget_ms` None: no budget, every chunk is the
    largest (measurements are still taken, for the statistics)."""

    def __init__(self, largest: int, budget_ms: float | None) -> None:
        self.sizes = chunk_sizes(largest)
        self.budget_ms = budget_ms
        self._seconds = 0.0
        self._tokens = 0.0
        self.beside_decode: dict[int, int] = {}
        """Chunks sized while other sequences were decoding, by the size they were given."""

    @property
    def seconds_per_token(self) -> float | None:
        """What a prefilled token costs, as measured lately (None: nothing measured yet)."""
        return self._seconds / self._tokens if self._tokens > 0 else None

    def size(self, rows: int, *, decoding: bool) -> int:
        """Tokens per prompt for the next chunk of `rows` prompts; `decoding`: other
        sequences wait for it. A chunk given a size is counted as run."""
        size = self.sizes[-1]
        per_token = self.seconds_per_token
        if decoding and self.budget_ms is not None:
            if per_token is None:
                size = self.sizes[0]
            else:
                fits = self.budget_ms / 1000 / (per_token * max(rows, 1))
                size = next((s for s in reversed(self.sizes) if s <= fits), self.sizes[0])
        if decoding:
            self.beside_decode[size] = self.beside_decode.get(size, 0) + 1
        return size

    def observe(self, tokens: int, seconds: float) -> None:
        """A chunk of `tokens` (rows times length, padding included) took `seconds`."""
        if tokens <= 0 or seconds < 0:
            return
        if self._tokens == 0:
            self._seconds, self._tokens = seconds, float(tokens)
            return
        self._seconds += SMOOTHING * (seconds - self._seconds)
        self._tokens += SMOOTHING * (tokens - self._tokens)
