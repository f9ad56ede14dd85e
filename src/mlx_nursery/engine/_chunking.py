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

A chunk run beside decoding sequences is launched asynchronously, right after the decode
step (`_schedule.py`): nothing waits for it on its own, so its time is not read from a
sync of its own. What it costs the running streams is what they see: the wall time between
two decode steps' tokens. `GapMeter` keeps a moving average of those gaps while no chunk is
in flight, and gives a chunk the excess of the gaps it was in flight for over that average
(a chunk launched after step k has landed by the time step k+2's tokens are read: the
device runs in launch order). A chunk with nothing decoding beside it, and a lone prompt's
chunk on the fast path, are evaluated synchronously and timed directly.
"""

from __future__ import annotations

import mlx.core as mx

from ._backend import on_cuda

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


CHUNK_TOKENS = 512
"""The largest chunk where `CUDA_CHUNK_TOKENS` was not measured better (the CPU, Metal;
`EngineConfig.prefill_step_size` unset): a prompt prefilled while nothing decodes is not
shrunk by the budget, and a cancel waits for the chunk in flight."""

CUDA_CHUNK_TOKENS = 1024
"""The largest chunk on CUDA: a chunk's launch costs the host about the same whatever its
length while the step is bound by the host, so a typical prompt in one chunk rather than two
gives the running streams more steps (docs/benchmarks.md, "Prefill chunks of 1,024
tokens"). mlx-lm prefills in chunks of 2,048."""


def chunk_tokens(configured: int | None) -> int:
    """The largest prefill chunk for `EngineConfig.prefill_step_size` (None: the default of
    this process's MLX device; engine thread, it asks MLX)."""
    if configured is not None:
        return configured
    return CUDA_CHUNK_TOKENS if on_cuda() else CHUNK_TOKENS


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


CHUNK_SYNCS = 2
"""Decode steps whose tokens are read before a chunk launched after a decode step has surely
landed: the next step was launched before the chunk, the one after it behind it."""


class GapMeter:
    """Measures what asynchronous prefill chunks cost the sequences decoding beside them,
    from the gaps between decode steps (this module's docstring), and tells a `ChunkSizer`.
    Engine thread only.

    A gap in which a chunk is in flight counts for the chunks in flight by its excess over
    the average gap without one (the whole gap until such a gap has been seen: chunks are
    then sized smaller than they need be, never larger); the excess summed until a chunk has
    surely landed is observed with that chunk's tokens. Where chunks follow each other, each
    gap's excess goes to the oldest: over a run of chunks the excess and the tokens both add
    up, which is what the sizer's ratio of averages reads."""

    def __init__(self, sizer: ChunkSizer) -> None:
        self._sizer = sizer
        self._last: float | None = None
        """When the previous decode step's tokens were read (None: no step since a pause)."""
        self._base: float | None = None
        """The moving average of gaps no chunk was in flight for."""
        self._in_flight: list[list[int]] = []
        """[tokens, decode steps still to read before it has surely landed], oldest first."""
        self._excess = 0.0

    @property
    def base_seconds(self) -> float | None:
        """The average gap between decode steps with no chunk in flight (None: none yet)."""
        return self._base

    def launched(self, tokens: int) -> None:
        """A chunk of `tokens` (rows times length) was launched after this step's decode."""
        self._in_flight.append([tokens, CHUNK_SYNCS])

    def decoded(self, now: float) -> None:
        """A decode step's tokens were read at `now` (`time.perf_counter()`)."""
        last, self._last = self._last, now
        if last is None:
            return
        gap = now - last
        if not self._in_flight:
            self._base = gap if self._base is None else self._base + SMOOTHING * (gap - self._base)
            return
        self._excess += max(0.0, gap - (self._base or 0.0))
        landed = 0
        for chunk in self._in_flight:
            chunk[1] -= 1
            if chunk[1] <= 0:
                landed += chunk[0]
        if landed:
            self._in_flight = [chunk for chunk in self._in_flight if chunk[1] > 0]
            self._sizer.observe(landed, self._excess)
            self._excess = 0.0

    def paused(self) -> None:
        """No decode step ran: the gap to the next is no decode gap, and the chunks in
        flight can no longer be timed (a synchronous chunk's time will include them)."""
        self._last = None
        self._in_flight.clear()
        self._excess = 0.0
