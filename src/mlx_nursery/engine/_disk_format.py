"""The prefix cache's files on disk: names, layout, an atomic write, and a read that checks
everything before anything is served. NumPy and the standard library only (no MLX): the
disk tier's own threads run it.

A file holds one sequence's KV state in the safetensors layout (an 8-byte little-endian
header length, a JSON header of tensors and string metadata, then the tensors' bytes), so
any safetensors reader opens it. Its tensors: `tokens` (the sequence's cache key, int64),
then the model's KV arrays in the engine's layer order (`Layout`), each with the sequence on
axis 2. Its metadata: the format and version, the model identity (weights, config, KV
layout and block size: `_disk_kv.model_identity`), the namespace root, the chain of block
hashes, the token count and a CRC-32 of each `CHECK_BLOCK` bytes of the data (blocks
checked on several threads at once, each as it is read: `read_data`).

Names: the prompt's tokens are cut in blocks of `block` tokens; a chain of hashes runs over
them from a root that names the model identity and the namespace (model and cache key: a
tenant's files are not another's), `h[i] = blake2b(h[i-1] + block i)`. A file is named by
its model identity and the last hash of its own chain, so that a name says which full
blocks the file holds, and the chain in its header says which shorter prefixes it holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

FORMAT = "mlx-nursery-prefix-kv"
VERSION = "2"
"""2: a CRC-32 per block of the data (1: one over all of it, refused as another format)."""
SUFFIX = ".kv.safetensors"
SEQUENCE_AXIS = 2
MAX_HEADER_BYTES = 1 << 24
"""A header past this is refused unread (a chain of 1M blocks' hashes fits in it)."""
CHECK_BLOCK = 8 << 20
"""Bytes of data per CRC-32: a reader thread reads a block and sums it while it is in the
CPU's cache, and several threads read blocks at once."""
_CRC_KEY = b'"crc32":"'

DTYPES: dict[str, np.dtype[np.generic]] = {
    "BF16": np.dtype("<u2"),  # bfloat16 as its bits: NumPy has no bfloat16
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
}
"""The safetensors dtypes a KV array may have, and their host arrays."""


class FileRejected(Exception):
    """A file that is not what its name promises (truncated, damaged, another model's, another
    KV layout's, or not ours at all): it is never served, and is deleted."""


@attrs.frozen
class Layout:
    """The tensors a model's KV state is stored as, in order: name, safetensors dtype, and
    shape with the sequence axis (2) at 0."""

    tensors: tuple[tuple[str, str, tuple[int, ...]], ...]

    def shapes(self, tokens: int) -> list[tuple[int, ...]]:
        return [_with_length(shape, tokens) for _, _, shape in self.tensors]

    def arrays(self, tokens: int) -> list[tuple[str | None, tuple[int, ...]]]:
        """Each tensor's dtype and shape at `tokens` tokens."""
        return [(dtype, _with_length(shape, tokens)) for _, dtype, shape in self.tensors]


@attrs.frozen
class Header:
    """A file's header, checked for shape (not yet against an engine: `check`)."""

    identity: str
    root: str
    chain: tuple[str, ...]
    tokens: int
    crc32: tuple[int, ...]
    """A CRC-32 per `CHECK_BLOCK` bytes of the data, the last block's may be shorter."""
    tensors: tuple[tuple[str, str, tuple[int, ...], int, int], ...]
    """Name, dtype, shape, data offsets (start, end), in data order."""
    data_start: int
    data_bytes: int

    def check(self, identity: str, layout: Layout, block: int, name: str) -> None:
        """Raise FileRejected unless the file is this engine's, and named for its chain."""
        if self.identity != identity:
            raise FileRejected("another model or KV format wrote it")
        if len(self.chain) != self.tokens // block or not self.chain:
            raise FileRejected("its chain does not cover its tokens")
        if file_name(identity, bytes.fromhex(self.chain[-1])) != name:
            raise FileRejected("its name is not its chain's")
        expected: list[tuple[str, str, tuple[int, ...]]] = [("tokens", "I64", (self.tokens,))]
        shapes = layout.shapes(self.tokens)
        expected += [(n, d, s) for (n, d, _), s in zip(layout.tensors, shapes, strict=True)]
        if [t[:3] for t in self.tensors] != expected:
            raise FileRejected("its tensors are not this model's KV layout")


def namespace_root(identity: str, namespace: str) -> bytes:
    """The chain's root for one model identity and one namespace (a tenant's cache key)."""
    return hashlib.blake2b(f"{identity}\0{namespace}".encode(), digest_size=16).digest()


def block_chain(root: bytes, tokens: Sequence[int], block: int) -> list[bytes]:
    """The hashes of `tokens`' full blocks, each over the one before it."""
    data = np.asarray(tokens, dtype="<i8").tobytes()
    step = block * 8
    chain: list[bytes] = []
    previous = root
    for start in range(0, len(tokens) // block * step, step):
        previous = hashlib.blake2b(previous + data[start : start + step], digest_size=16).digest()
        chain.append(previous)
    return chain


def file_name(identity: str, last: bytes) -> str:
    """The name of a file of this model identity whose chain ends at `last`: the identity's
    prefix tells a model's files from others' in a shared directory without reading them."""
    return f"{identity[:16]}-{last.hex()}{SUFFIX}"


def write_entry(
    directory: Path,
    name: str,
    metadata: dict[str, str],
    tensors: Sequence[tuple[str, str, np.ndarray]],
) -> int:
    """Write a file atomically: a temporary file in `directory` (hidden, its writer named),
    renamed over `name` once whole (no fsync: a file cut short by a crash is refused on
    reading). Returns its size. Raises OSError; leaves no temporary file behind."""
    offset = 0
    entries: dict[str, object] = {}
    for tensor, dtype, array in tensors:
        size = array.size * DTYPES[dtype].itemsize
        entries[tensor] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    placeholder = "0" * 8 * -(-offset // CHECK_BLOCK)
    table = {"__metadata__": {**metadata, "crc32": placeholder}, **entries}
    header = json.dumps(table, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    at = 8 + header.index(_CRC_KEY) + len(_CRC_KEY)
    temporary = directory / f".{name}.{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with open(temporary, "wb") as file:
            file.write(len(header).to_bytes(8, "little") + header)
            sums = _BlockSums()
            for _, dtype, array in tensors:
                data = np.ascontiguousarray(array, dtype=DTYPES[dtype])
                view = data.data.cast("B")
                sums.update(view)
                file.write(view)
            file.seek(at)
            file.write(sums.finish().encode())
        os.replace(temporary, directory / name)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return 8 + len(header) + offset


def read_header(path: Path) -> Header:
    """A file's header, checked for shape: raises FileRejected for one that is not a whole
    file of this format, OSError for one that cannot be read (gone: FileNotFoundError)."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        raw = file.read(8)
        length = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if not 0 < length <= MAX_HEADER_BYTES or 8 + length > size:
            raise FileRejected("no header")
        text = file.read(length)
    try:
        return _parse(json.loads(text), 8 + length, size)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise FileRejected(f"an unreadable header ({exc.__class__.__name__})") from None


def _parse(table: dict[str, object], data_start: int, size: int) -> Header:
    meta = table.pop("__metadata__")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FileRejected("not a prefix-cache file")
    if meta.get("version") != VERSION:
        raise FileRejected(f"format version {meta.get('version')!r}, not {VERSION}")
    tensors = []
    for tensor, spec in table.items():
        assert isinstance(spec, dict)
        dtype, shape = str(spec["dtype"]), tuple(int(n) for n in spec["shape"])
        start, end = (int(n) for n in spec["data_offsets"])
        if dtype not in DTYPES or end - start != int(np.prod(shape)) * DTYPES[dtype].itemsize:
            raise FileRejected(f"tensor {tensor!r} is not the size its header says")
        tensors.append((tensor, dtype, shape, start, end))
    tensors.sort(key=lambda t: t[3])
    ends = [0] + [t[4] for t in tensors]
    if any(t[3] != ends[i] for i, t in enumerate(tensors)):
        raise FileRejected("its tensors do not follow one another")
    if data_start + ends[-1] != size:
        raise FileRejected("truncated, or longer than its header says")
    chain = str(meta["chain"])
    return Header(
        identity=str(meta["identity"]),
        root=str(meta["root"]),
        chain=tuple(chain.split(",")) if chain else (),
        tokens=int(meta["tokens"]),
        crc32=_block_sums(str(meta["crc32"]), ends[-1]),
        tensors=tuple(tensors),
        data_start=data_start,
        data_bytes=ends[-1],
    )


class _BlockSums:
    """CRC-32s of each `CHECK_BLOCK` bytes of a stream fed in pieces of any size."""

    def __init__(self) -> None:
        self._sums: list[int] = []
        self._crc = 0
        self._filled = 0

    def update(self, view: memoryview) -> None:
        at = 0
        while at < len(view):
            take = min(CHECK_BLOCK - self._filled, len(view) - at)
            self._crc = zlib.crc32(view[at : at + take], self._crc)
            self._filled += take
            at += take
            if self._filled == CHECK_BLOCK:
                self._sums.append(self._crc)
                self._crc, self._filled = 0, 0

    def finish(self) -> str:
        """The sums as the header holds them: 8 hex digits each, one after another."""
        if self._filled:
            self._sums.append(self._crc)
        return "".join(f"{crc:08x}" for crc in self._sums)


def _block_sums(text: str, data_bytes: int) -> tuple[int, ...]:
    """The header's CRC-32s, one per block of `data_bytes` (ValueError if not)."""
    if len(text) != 8 * -(-data_bytes // CHECK_BLOCK):
        raise ValueError("one CRC-32 per block")
    return tuple(int(text[i : i + 8], 16) for i in range(0, len(text), 8))


def _with_length(shape: tuple[int, ...], tokens: int) -> tuple[int, ...]:
    return (*shape[:SEQUENCE_AXIS], tokens, *shape[SEQUENCE_AXIS + 1 :])
