"""Reading a prefix-cache file's data, checked, as fast as the machine reads its page cache:
the disk tier's reader thread calls `read_data`. NumPy and the standard library only (no
MLX).

Where the time went before: one thread read the file 4 MiB at a time, then summed it, into
a fresh NumPy buffer whose every 4 KiB page the kernel faulted in one by one, and then each
array's prefix was copied into yet another fresh buffer. Now:
- blocks of `CHECK_BLOCK` bytes are read (`os.preadv`, straight into the buffer) and summed
  on several threads at once (both release the GIL), each block summed while it is still in
  the CPU's cache;
- the buffer is an anonymous mapping asking for huge pages (Linux), so that the first touch
  of its memory costs a fault per 2 MiB rather than per 4 KiB;
- the arrays served are views of that buffer (a prefix of each: strided), copied once, into
  MLX, by the engine thread (`_disk_kv.Restoring`).

Cancellation: `stop` is asked before each block; once it says so, the blocks not begun are
skipped and `ReadStopped` is raised after those in flight are over (the buffer is never
released while a thread writes into it).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path

import numpy as np

from ._disk_format import CHECK_BLOCK, DTYPES, FileRejected, Header


def _cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


READ_THREADS = max(1, min(8, _cores() // 2))
"""Threads reading and summing blocks at once (1: the reader thread alone): copying out of
the page cache and summing are each bound by one core's speed, and both release the GIL;
half the cores, so that the engine thread keeps one. On a 2-core machine shared with other
work, two threads ran slower than one."""


class ReadStopped(Exception):
    """`stop` said so before the read was over: nothing is served (and nothing refused)."""


def read_data(
    path: Path,
    header: Header,
    *,
    pool: Executor | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The file's tokens and KV arrays (in header order, after `tokens`), once every block's
    CRC-32 matches the header's: FileRejected if one does not or the file is shorter than
    its header says, ReadStopped (`stop`), OSError if it cannot be read. Blocks are read on
    `pool`'s threads (None: on this one)."""
    data = host_buffer(header.data_bytes)
    view = data.data.cast("B")
    failed = threading.Event()

    def block(index: int) -> None:
        if failed.is_set() or stop():
            failed.set()
            raise ReadStopped
        start = index * CHECK_BLOCK
        chunk = view[start : start + CHECK_BLOCK]
        _read_into(path, fd, chunk, header.data_start + start)
        if zlib.crc32(chunk) != header.crc32[index]:  # while the block is in the CPU's cache
            failed.set()
            raise FileRejected("its data do not match their checksums")

    with open(path, "rb", buffering=0) as file:
        fd = file.fileno()
        indices = range(len(header.crc32))
        if pool is None:
            for index in indices:
                block(index)
        else:
            _all_or_first_error([pool.submit(block, index) for index in indices])
    arrays = [
        data[start:end].view(DTYPES[dtype]).reshape(shape)
        for _, dtype, shape, start, end in header.tensors
    ]
    return arrays[0], arrays[1:]


def host_buffer(nbytes: int) -> np.ndarray:
    """`nbytes` of uninitialised host memory: an anonymous mapping that asks for huge pages
    where the system has them (its pages are faulted in as the read writes them), else an
    ordinary NumPy array. Freed when the last view of it goes."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes <= 0 or advice is None:
        return np.empty(max(nbytes, 0), dtype=np.uint8)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # huge pages switched off: ordinary pages
        mapping.madvise(advice)
    return np.frombuffer(mapping, dtype=np.uint8)


def _read_into(path: Path, fd: int, chunk: memoryview, offset: int) -> None:
    """Fill `chunk` from `offset`: with `os.preadv` on the shared descriptor where the system
    has it, else through a file of this block's own (no shared file position)."""
    if not hasattr(os, "preadv"):
        with open(path, "rb", buffering=0) as file:
            file.seek(offset)
            if file.readinto(chunk) != len(chunk):
                raise FileRejected("truncated while being read")
        return
    got = 0
    while got < len(chunk):
        n = os.preadv(fd, [chunk[got:]], offset + got)
        if n == 0:
            raise FileRejected("truncated while being read")
        got += n


def _all_or_first_error(futures: list[Future[None]]) -> None:
    """Wait for every future (those not begun are cancelled once one has failed), then
    raise the first failure: a refusal before a stop, either before an OSError."""
    errors: list[BaseException] = []
    for future in futures:
        if future.cancelled():
            continue
        error = future.exception()
        if error is not None:
            errors.append(error)
            for later in futures:
                later.cancel()
    if errors:
        raise min(errors, key=_rank)


def _rank(error: BaseException) -> int:
    return 0 if isinstance(error, FileRejected) else 1 if isinstance(error, ReadStopped) else 2
