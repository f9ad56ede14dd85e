"""Whether reading a stored prefix from disk is expected to be faster than prefilling it.

A GPU prefills a mid-sized model's long prompt faster than a host may read, check and copy
its KV from a file (on an H100, a long prefix's first token came later from disk than cold:
issue 35). So each read is decided at admission: the file's bytes at the measured
read rate against the tokens it would spare at the measured prefill rate, and the disk is
skipped (counted: `DiskCacheStats.skipped_slower`) when the read is expected to take longer.

- The read rate is end to end, as the waiting request sees it: the reader's time on the
  file (read, checked) plus the engine thread's copy into MLX, over the file's bytes; a
  moving average over the reads served, seeded by `EngineConfig.prompt_cache_disk_read_rate`
  or, without one, by the process's first read (taken whatever it costs: a rule that never
  reads would never learn the rate).
- The prefill rate is `ChunkSizer.seconds_per_token` (what the engine's own prefill chunks
  cost lately). Until a prefill has been measured, the disk is read. A long prompt's tokens
  cost more than the average chunk's (attention grows with the context), so the prefill a
  read spares is underestimated: a close call goes to the prefill, never slower than it.
- The tokens spared are those of the file's blocks that match the prompt, less what memory
  already holds (the read may serve a few more: the tokens within the next block).

Engine thread only (the reader's time arrives with the read, as its result does).
"""

from __future__ import annotations

SMOOTHING = 0.3
"""Weight of the newest read in the moving average (as the chunk sizer weighs chunks)."""


class ReadRate:
    """The expected seconds per byte of a read from disk (see the module docstring)."""

    def __init__(self, seed_bytes_per_second: float | None) -> None:
        self.seconds_per_byte = 1 / seed_bytes_per_second if seed_bytes_per_second else None
        """None: nothing measured nor seeded yet."""

    @property
    def bytes_per_second(self) -> float | None:
        return 1 / self.seconds_per_byte if self.seconds_per_byte else None

    def observe(self, nbytes: int, seconds: float) -> None:
        """A read of a file of `nbytes` took `seconds` (read, checked, copied into MLX)."""
        if nbytes <= 0 or seconds <= 0:
            return
        measured = seconds / nbytes
        if self.seconds_per_byte is None:
            self.seconds_per_byte = measured
        else:
            self.seconds_per_byte += SMOOTHING * (measured - self.seconds_per_byte)

    def worth_reading(
        self, file_bytes: int, spared_tokens: int, prefill_seconds_per_token: float | None
    ) -> bool:
        """Whether reading `file_bytes` is expected to take no longer than prefilling
        `spared_tokens` (True while either rate is unknown)."""
        if self.seconds_per_byte is None or prefill_seconds_per_token is None:
            return True
        return file_bytes * self.seconds_per_byte <= spared_tokens * prefill_seconds_per_token
