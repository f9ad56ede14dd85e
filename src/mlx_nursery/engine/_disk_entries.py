"""What the prefix cache's disk tier and the engine hand each other (`_disk_tier.py`): its
statistics, a read's request and result, a write. Plain data, no I/O and no MLX."""

from __future__ import annotations

import threading

import attrs
import numpy as np


@attrs.frozen
class DiskCacheStats:
    """What the prefix cache's disk tier holds, and has done since the engine started."""

    files: int
    """This model's files in the directory."""
    nbytes: int
    """The directory's bytes (every model's files), as last counted."""
    hits: int
    hit_tokens: int
    """Prompt tokens served from files."""
    writes: int
    write_failures: int
    """Writes that failed (the disk full, say): the entry is not kept."""
    dropped: int
    """Entries not written because the writer was behind."""
    rejected: int
    """Files found damaged, cut short, or another model's or KV layout's: deleted unserved."""
    evictions: int
    skipped_slower: int = 0
    """Stored prefixes not read: reading them was expected to take longer than prefilling
    them (`_disk_rates.py`)."""
    read_bytes_per_second: float | None = None
    """The end-to-end read rate the rule expects (measured or seeded; None: neither yet)."""


@attrs.define(eq=False)
class DiskRead:
    """One sequence's read of the file `name`, whose chain matches its prompt's first
    `blocks` blocks. The reader sets `kv` (None: nothing to serve) and then `done`."""

    name: str
    root: str
    key: list[int]
    blocks: int
    limit: int
    """The most tokens to serve: a prompt's last token is always prefilled."""
    done: threading.Event = attrs.Factory(threading.Event)
    cancelled: bool = False
    kv: HostKV | None = None
    read_seconds: float = 0.0
    """The reader's time on it (set with `kv`)."""


@attrs.frozen
class HostKV:
    """A prefix's KV state as host arrays, in the layout's order, `tokens` long on axis 2
    (views of the buffer the file was read into: strided where the file holds more tokens)."""

    tokens: int
    arrays: list[np.ndarray]
    file_bytes: int
    """The size of the file they were read from."""


@attrs.frozen
class DiskWrite:
    """A file to write: host arrays the engine thread keeps alive until `ticket` comes back
    (`written`)."""

    ticket: int
    name: str
    chain: tuple[bytes, ...]
    metadata: dict[str, str]
    tensors: list[tuple[str, str, np.ndarray]]
    nbytes: int
