"""The prefix cache's disk tier: a directory of KV files, an index of them in memory, and two
threads of its own that do all of its file I/O, so that the engine thread never waits on a
disk. No MLX here: the engine thread converts between KV caches and host arrays
(`_disk_kv.py`); this module moves host arrays to and from files (`_disk_format.py`).

- The writer thread first scans the directory: this model's files (known by their names'
  identity prefix) are indexed from their headers, a file that fails the header's checks is
  deleted, and the directory is brought within its byte bound. Then it writes what the
  engine hands it, in order, and evicts the least recently used files of the directory,
  whichever model's, while the directory is past its bound (a directory may be shared by
  several models and servers: each keeps the whole directory within the bound it was given).
- The reader thread reads a file for a sequence waiting on it, checks it whole (header,
  size, checksums, tokens), and leaves host arrays of the prefix to serve, or nothing. A
  file that fails a check is deleted and counted, never served. The data's blocks are read
  and summed on a small pool of threads (`_disk_read.py`); the reader thread waits for them.
- Recency is the files' mtime: set on each write and each read served, with a clock that
  never gives two events the same time in one process.

Cancellation: a read whose sequence went away is skipped if not started, stopped at its
next block if under way, its result dropped if done. `close` drops reads not started, stops
the one under way, and waits for the writes handed over (their bytes are bounded:
`MAX_PENDING_BYTES`, or one entry), then joins both threads and the read pool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import numpy as np

from ._disk_entries import DiskCacheStats, DiskRead, DiskWrite, HostKV
from ._disk_format import (
    SEQUENCE_AXIS,
    SUFFIX,
    FileRejected,
    Layout,
    read_header,
    write_entry,
)
from ._disk_read import READ_THREADS, ReadStopped, read_data

log = logging.getLogger("mlx_nursery.engine")

MAX_PENDING_BYTES = 1 << 30
"""Bytes of KV handed to the writer and not yet written, past which a new entry is not
written (one entry is always taken when none waits): the writer falling behind costs
cache entries, never memory without bound."""
STALE_TEMPORARY_SECONDS = 3600.0
"""A temporary file this old is a crashed writer's: the scan deletes it."""


@attrs.define
class _File:
    chain: tuple[bytes, ...]
    tokens: int
    nbytes: int


class DiskTier:
    """The files of one model's identity in `directory`, bounded to `max_bytes` for the whole
    directory. Engine-thread methods: `find`, `read`, `holds`, `write`, `written`, `hit`,
    `stats`, `wait_ready`, `close`; the rest runs on the tier's threads."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        identity: str,
        layout: Layout,
        block: int,
        wake: Callable[[], None],
    ) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory = directory
        self.max_bytes = max_bytes
        self.identity = identity
        self.layout = layout
        self.block = block
        self._wake = wake
        self._lock = threading.Lock()
        self._files: dict[str, _File] = {}
        self._blocks: dict[bytes, set[str]] = {}
        """A block hash -> the files whose chain holds it (the index a lookup walks)."""
        self._queued: set[str] = set()
        self._pending_bytes = 0
        self._nbytes = 0
        self._stamp_ns = 0
        self._hits = self._hit_tokens = self._writes = self._failures = 0
        self._dropped = self._rejected = self._evictions = self._skipped = 0
        self._closing = False
        self._writes_in: queue.SimpleQueue[DiskWrite | None] = queue.SimpleQueue()
        self._reads_in: queue.SimpleQueue[DiskRead | None] = queue.SimpleQueue()
        self._acks: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._pool = (
            ThreadPoolExecutor(READ_THREADS, thread_name_prefix="mlx-nursery-disk-read")
            if READ_THREADS > 1
            else None
        )
        self._threads = [
            threading.Thread(target=self._write_loop, name="mlx-nursery-disk-writer", daemon=True),
            threading.Thread(target=self._read_loop, name="mlx-nursery-disk-reader", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # -- the engine thread ------------------------------------------------------------------
    def wait_ready(self) -> None:
        """Block until the startup scan is done (the engine reports ready after it)."""
        self._ready.wait()

    def find(self, chain: list[bytes]) -> tuple[str, int, int] | None:
        """The file holding the most of `chain`'s blocks, how many, and its size in bytes
        (None: none)."""
        deepest: set[str] = set()
        blocks = 0
        with self._lock:
            for digest in chain:
                names = self._blocks.get(digest)
                if not names:
                    break
                deepest, blocks = names, blocks + 1
            if not blocks:
                return None
            name = max(deepest, key=lambda n: self._files[n].tokens)
            return name, blocks, self._files[name].nbytes

    def holds(self, name: str, last: bytes) -> bool:
        """Whether a file holds the block ending at `last`, or a queued write is `name`."""
        with self._lock:
            return last in self._blocks or name in self._queued

    def read(self, read: DiskRead) -> None:
        """Queue a read; its `done` is set (and the engine woken) once it is over."""
        self._reads_in.put(read)

    def write(self, write: DiskWrite) -> bool:
        """Queue a write (False: dropped, the writer being behind)."""
        with self._lock:
            if self._pending_bytes and self._pending_bytes + write.nbytes > MAX_PENDING_BYTES:
                self._dropped += 1
                return False
            self._pending_bytes += write.nbytes
            self._queued.add(write.name)
        self._writes_in.put(write)
        return True

    def written(self) -> list[int]:
        """The tickets of the writes over since the last call (their arrays may go)."""
        tickets = []
        while not self._acks.empty():  # the engine thread is the only reader
            tickets.append(self._acks.get_nowait())
        return tickets

    def write_failed(self) -> None:
        with self._lock:
            self._failures += 1

    def skipped(self) -> None:
        """A stored prefix was not read: prefilling it was expected to be faster."""
        self._skipped += 1

    def hit(self, tokens: int) -> None:
        self._hits += 1
        self._hit_tokens += tokens

    def stats(self) -> DiskCacheStats:
        return DiskCacheStats(
            files=len(self._files),
            nbytes=self._nbytes,
            hits=self._hits,
            hit_tokens=self._hit_tokens,
            writes=self._writes,
            write_failures=self._failures,
            dropped=self._dropped,
            rejected=self._rejected,
            evictions=self._evictions,
            skipped_slower=self._skipped,
        )

    def close(self) -> None:
        """Drop the reads not started, finish the writes queued, join both threads."""
        self._closing = True
        self._reads_in.put(None)
        self._writes_in.put(None)
        for thread in self._threads:
            thread.join()
        if self._pool is not None:
            self._pool.shutdown()

    # -- the writer thread ------------------------------------------------------------------
    def _write_loop(self) -> None:
        try:
            self._scan()
        except Exception:  # a directory that cannot be listed: the tier holds nothing
            log.exception("could not scan the prefix-cache directory %s", self.directory)
        finally:
            self._ready.set()
        while (write := self._writes_in.get()) is not None:
            try:
                self._write(write)
            except Exception as exc:  # noqa: BLE001 - the entry is lost, nothing else
                log.warning("could not write a prefix-cache file: %s", exc)
                self.write_failed()
            finally:
                with self._lock:
                    self._pending_bytes -= write.nbytes
                    self._queued.discard(write.name)
                self._acks.put(write.ticket)

    def _scan(self) -> None:
        prefix = self.identity[:16] + "-"
        for entry in os.scandir(self.directory):
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):  # gone meanwhile: its writer finished
                    if entry.stat().st_mtime < time.time() - STALE_TEMPORARY_SECONDS:
                        Path(entry.path).unlink(missing_ok=True)
            elif entry.name.startswith(prefix) and entry.name.endswith(SUFFIX):
                try:
                    header = read_header(Path(entry.path))
                    header.check(self.identity, self.layout, self.block, entry.name)
                except FileRejected as exc:
                    self._reject(entry.name, str(exc))
                    continue
                except OSError:
                    continue
                chain = tuple(bytes.fromhex(h) for h in header.chain)
                size = header.data_start + header.data_bytes
                self._index(entry.name, _File(chain, header.tokens, size))
        self._evict(keep=None)
        log.info(
            "prefix cache on disk: %s holds %d files of this model (%d bytes, every model's)",
            self.directory,
            len(self._files),
            self._nbytes,
        )

    def _write(self, write: DiskWrite) -> None:
        if write.nbytes > self.max_bytes:  # it would evict the whole directory
            with self._lock:
                self._dropped += 1
            return
        size = write_entry(self.directory, write.name, write.metadata, write.tensors)
        self._touch(write.name)
        self._index(write.name, _File(write.chain, int(write.metadata["tokens"]), size))
        self._writes += 1
        self._nbytes += size
        if self._nbytes > self.max_bytes:
            self._evict(keep=write.name)

    def _evict(self, *, keep: str | None) -> None:
        """Delete the directory's least recently used files (any model's) past the bound."""
        files = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                try:
                    stat = entry.stat()
                except OSError:
                    continue
                files.append((stat.st_mtime_ns, entry.name, stat.st_size))
        total = sum(size for _, _, size in files)
        for _, name, size in sorted(files):
            if total <= self.max_bytes:
                break
            if name == keep:
                continue
            (self.directory / name).unlink(missing_ok=True)
            self._unindex(name)
            total -= size
            self._evictions += 1
        self._nbytes = total

    # -- the reader thread ------------------------------------------------------------------
    def _read_loop(self) -> None:
        while (read := self._reads_in.get()) is not None:
            started = time.perf_counter()
            try:
                if not read.cancelled and not self._closing:
                    read.kv = self._read(read)
            except ReadStopped:  # cancelled, or the engine closing: nothing to serve
                pass
            except Exception:  # a read that fails serves nothing; logged
                log.exception("could not read prefix-cache file %s", read.name)
            finally:
                read.read_seconds = time.perf_counter() - started
                read.done.set()
                self._wake()

    def _read(self, read: DiskRead) -> HostKV | None:
        path = self.directory / read.name
        try:
            header = read_header(path)
            header.check(self.identity, self.layout, self.block, read.name)
            if header.root != read.root:
                raise FileRejected("another namespace's")
            tokens, arrays = read_data(
                path, header, pool=self._pool, stop=lambda: read.cancelled or self._closing
            )
        except FileNotFoundError:  # evicted meanwhile (by another server sharing it, say)
            self._unindex(read.name)
            return None
        except FileRejected as exc:
            self._reject(read.name, str(exc))
            return None
        length = min(header.tokens, len(read.key))
        differ = np.flatnonzero(tokens[:length] != np.asarray(read.key[:length], dtype=np.int64))
        common = int(differ[0]) if differ.size else length
        if common < read.blocks * self.block:
            self._reject(read.name, "its tokens are not its chain's")
            return None
        keep = min(common, read.limit)
        if keep < header.tokens:
            arrays = [_prefix(a, keep) for a in arrays]  # copied once, into MLX
        self._touch(read.name)
        return HostKV(keep, arrays, header.data_start + header.data_bytes)

    # -- both --------------------------------------------------------------------------------
    def _reject(self, name: str, reason: str) -> None:
        log.warning("prefix-cache file %s refused and deleted: %s", name, reason)
        (self.directory / name).unlink(missing_ok=True)
        self._unindex(name)
        with self._lock:
            self._rejected += 1

    def _touch(self, name: str) -> None:
        """Mark a file used now: its mtime, later than any this process set before."""
        with self._lock:
            self._stamp_ns = max(time.time_ns(), self._stamp_ns + 1)
            stamp = self._stamp_ns
        with contextlib.suppress(OSError):  # gone meanwhile: its recency no longer matters
            os.utime(self.directory / name, ns=(stamp, stamp))

    def _index(self, name: str, file: _File) -> None:
        with self._lock:
            self._files[name] = file
            for digest in file.chain:
                self._blocks.setdefault(digest, set()).add(name)

    def _unindex(self, name: str) -> None:
        with self._lock:
            file = self._files.pop(name, None)
            for digest in file.chain if file is not None else ():
                names = self._blocks.get(digest)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._blocks[digest]


def _prefix(array: np.ndarray, tokens: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[SEQUENCE_AXIS] = slice(0, tokens)
    return array[tuple(index)]
