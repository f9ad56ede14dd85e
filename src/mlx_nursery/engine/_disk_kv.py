"""The prefix cache's disk tier as the engine thread uses it: a model's KV layout and
identity, ended sequences' KV handed to the writer as host arrays, and host arrays read
back turned into KV caches, a bounded number of bytes per iteration.

Engine thread only: every MLX call here runs on it. What it hands the writer thread are
NumPy views of arrays it evaluated itself, a step after it launched their evaluation (so
that taking the views rarely waits for the device; while nothing steps, at once); it keeps
those arrays alive until the writer says it is done with them, so that they are freed on
this thread too. Layers other than mlx-lm's `KVCache` and our `QuantizedKVRow` (rotating
windows, recurrent state) are not supported: such a model has no disk tier.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np

from ..models import LoadedModel
from ._config import EngineConfig
from ._disk_entries import DiskCacheStats, DiskRead, DiskWrite, HostKV
from ._disk_format import (
    FORMAT,
    SEQUENCE_AXIS,
    VERSION,
    Layout,
    block_chain,
    file_name,
    namespace_root,
)
from ._disk_rates import ReadRate
from ._disk_tier import DiskTier
from ._kv_quant import CacheFactory, QuantizedKVRow
from ._row_cache import is_plain_kv

log = logging.getLogger("mlx_nursery.engine")

RESTORE_BYTES_PER_ITERATION = 32 << 20
"""Bytes of a read prefix copied into MLX arrays per loop iteration while sequences decode
(a few milliseconds of a memory copy, as a prefill chunk bounds a step): a 2 GiB prefix
(an 8B model's 16K tokens) would otherwise stop the running streams for a fifth of a
second. While nothing decodes, the whole prefix at once."""

_DTYPE_NAMES = {mx.bfloat16: "BF16", mx.float16: "F16", mx.float32: "F32", mx.uint32: "U32"}
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz")


def kv_layout(model: Any, make_cache: CacheFactory) -> Layout | None:
    """The tensors this engine's KV state is made of (one token through a fresh cache), or
    None if a layer is of a kind the disk tier does not store."""
    cache = make_cache(model)
    model(mx.array([[0]]), cache=cache)
    tensors = []
    for i, layer in enumerate(cache):
        arrays = _arrays(layer)
        if arrays is None:
            return None
        for j, array in enumerate(arrays):
            shape = list(array.shape)
            shape[SEQUENCE_AXIS] = 0
            tensors.append((f"{i}.{j}", _DTYPE_NAMES[array.dtype], tuple(shape)))
    return Layout(tuple(tensors))


def model_identity(model: LoadedModel, layout: Layout, *, block: int, fused: bool) -> str:
    """What a file must have been written by to be served here: this config, these weight
    files (names, sizes and modification times: cheap, and another checkpoint differs in
    one of them), this KV layout (dtype, quantization, heads), the block size and the
    projections' fusing (the same outputs up to rounding, but not the same bits)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{FORMAT} {VERSION} block={block} fused={fused} {model.kind}\n".encode())
    digest.update(json.dumps(model.config, sort_keys=True, default=str).encode())
    digest.update(json.dumps(attrs.asdict(layout)).encode())
    for path in sorted(Path(model.path).iterdir()):
        if path.name.endswith(_WEIGHT_SUFFIXES):
            stat = path.stat()
            digest.update(f"{path.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@attrs.define
class _Pending:
    step: int
    name: str
    chain: tuple[bytes, ...]
    metadata: dict[str, str]
    key: list[int]
    arrays: list[mx.array]


class DiskKV:
    """One model's disk tier on the engine thread (see the module docstring)."""

    def __init__(
        self,
        tier: DiskTier,
        make_cache: Callable[[], list[Any]],
        read_rate: float | None = None,
    ) -> None:
        self.tier = tier
        self.rate = ReadRate(read_rate)
        """Reads' measured rate, against the prefill's (`_disk_rates.py`)."""
        self._make_cache = make_cache
        self._pending: list[_Pending] = []
        self._writing: dict[int, list[mx.array]] = {}
        self._tickets = 0

    def find(
        self,
        namespace: str,
        key: list[int],
        *,
        better_than: int,
        prefill_seconds_per_token: float | None = None,
    ) -> DiskRead | None:
        """Queue a read of the file holding the longest prefix of `key` if it is longer than
        `better_than` tokens (what the memory tier has) and reading it is expected to be
        faster than prefilling what it spares (`_disk_rates.py`; a read not worth it is
        counted); None: no read."""
        tier = self.tier
        if len(key) <= max(tier.block, better_than):
            return None
        key = _int64_key(key)
        root = namespace_root(tier.identity, namespace)
        found = tier.find(block_chain(root, key, tier.block))
        if found is None or found[1] * tier.block <= better_than:
            return None
        name, blocks, nbytes = found
        spared = min(blocks * tier.block, len(key) - 1) - better_than
        if not self.rate.worth_reading(nbytes, spared, prefill_seconds_per_token):
            tier.skipped()
            return None
        read = DiskRead(name, root.hex(), key, blocks, limit=len(key) - 1)
        tier.read(read)
        return read

    def offer(self, namespace: str, key: list[int], cache: list[Any], step: int) -> None:
        """Keep `cache` (the KV state of exactly `key`) on disk, if it is a full block or
        more that no file holds yet; its arrays' evaluation is launched now, the writer gets
        them later (`hand_over`)."""
        tier = self.tier
        if len(key) < tier.block or any(getattr(c, "offset", -1) != len(key) for c in cache):
            return
        key = _int64_key(key)
        root = namespace_root(tier.identity, namespace)
        chain = tuple(block_chain(root, key, tier.block))
        name = file_name(tier.identity, chain[-1])
        if tier.holds(name, chain[-1]) or any(p.name == name for p in self._pending):
            return
        arrays = [a for layer in cache for a in _arrays(layer) or ()]
        found = [(_DTYPE_NAMES.get(a.dtype), tuple(a.shape)) for a in arrays]
        if found != tier.layout.arrays(len(key)):
            return  # not this model's layout (a layer of another kind, another dtype)
        arrays = [a.view(mx.uint16) if a.dtype == mx.bfloat16 else a for a in arrays]
        mx.async_eval(arrays)  # type: ignore[no-untyped-call]
        metadata = {
            "format": FORMAT,
            "version": VERSION,
            "identity": tier.identity,
            "root": root.hex(),
            "chain": ",".join(h.hex() for h in chain),
            "tokens": str(len(key)),
        }
        self._pending.append(_Pending(step, name, chain, metadata, list(key), arrays))

    def hand_over(self, step: int, *, now: bool) -> None:
        """Give the writer the entries offered before step `step` (all of them if `now`),
        and let go of the arrays of writes that are over. Never raises: an entry that
        cannot be handed over is lost (logged, counted as a failed write)."""
        if not self._pending and not self._writing:  # the common case: settle runs per token
            return
        for ticket in self.tier.written():
            self._writing.pop(ticket, None)
        if not self._pending:
            return
        ready = [p for p in self._pending if now or p.step < step]
        self._pending = [p for p in self._pending if not (now or p.step < step)]
        for pending in ready:
            try:
                write = self._write(pending)
            except Exception:  # caching is an optimisation, never a failure: logged
                log.warning("could not hand a prefix-cache entry to the writer", exc_info=True)
                self.tier.write_failed()
                continue
            if self.tier.write(write):
                self._writing[write.ticket] = pending.arrays

    def _write(self, pending: _Pending) -> DiskWrite:
        """The write of `pending`: host views of its arrays (zero-copy where MLX's memory is
        the host's; a wait if their evaluation has not landed)."""
        self._tickets += 1
        hosts = [np.asarray(a) for a in pending.arrays]
        tensors = [("tokens", "I64", np.asarray(pending.key, dtype=np.int64))]
        layout = self.tier.layout.tensors
        tensors += [(n, d, h) for (n, d, _), h in zip(layout, hosts, strict=True)]
        nbytes = sum(h.nbytes for _, _, h in tensors)
        return DiskWrite(self._tickets, pending.name, pending.chain, pending.metadata,
                         tensors, nbytes)  # fmt: skip

    def restorer(self, kv: HostKV) -> Restoring:
        return Restoring(kv, self.tier.layout, self._make_cache())

    def stats(self) -> DiskCacheStats:
        return attrs.evolve(self.tier.stats(), read_bytes_per_second=self.rate.bytes_per_second)

    def served(self, read: DiskRead, restoring: Restoring) -> None:
        """`read`'s prefix is in MLX: count the hit, and measure the read's rate."""
        self.tier.hit(restoring.tokens)
        self.rate.observe(restoring.file_bytes, read.read_seconds + restoring.copy_seconds)

    def close(self) -> None:
        """Hand the writer every offered entry, wait for the writes, stop the tier."""
        self.hand_over(0, now=True)
        self.tier.close()
        self._writing.clear()


class Restoring:
    """A prefix read from disk becoming a KV cache: its arrays copied into MLX a bounded
    number of bytes at a time (`advance`), into a fresh cache of this engine's kind."""

    def __init__(self, kv: HostKV, layout: Layout, cache: list[Any]) -> None:
        self.tokens = kv.tokens
        self.file_bytes = kv.file_bytes
        self.copy_seconds = 0.0
        """The time spent copying, over every `advance`."""
        self._host = kv.arrays
        """The read's own list, emptied as its arrays are copied: each host array goes once
        it is in MLX."""
        self._dtypes = [dtype for _, dtype, _ in layout.tensors]
        self._arrays: list[mx.array] = []
        self.cache = cache

    @property
    def done(self) -> bool:
        return not self._host

    def advance(self, budget: int | None) -> int:
        """Copy arrays (at least one; all if `budget` is None) until `budget` bytes are
        spent; once the last is, the cache holds the whole prefix. Returns the bytes spent."""
        spent = 0
        started = time.perf_counter()
        while self._host and (budget is None or spent < budget):
            host = self._host.pop(0)
            array = mx.array(host)  # one copy, of a strided view where the file held more
            if self._dtypes[len(self._arrays)] == "BF16":
                array = array.view(mx.bfloat16)
            self._arrays.append(array)
            spent += host.nbytes
        if not self._host:
            self._fill()
        self.copy_seconds += time.perf_counter() - started
        return spent

    def _fill(self) -> None:
        arrays = iter(self._arrays)
        for layer in self.cache:
            if isinstance(layer, QuantizedKVRow):
                layer.keys = tuple(next(arrays) for _ in range(3))
                layer.values = tuple(next(arrays) for _ in range(3))
            else:
                layer.keys, layer.values = next(arrays), next(arrays)
            layer.offset = self.tokens
        self._arrays = []


def _int64_key(key: list[int]) -> list[int]:
    """A cache key as the files hold it, in int64: an image's name (a negative id from 64
    bits of its digest, `_vision.cache_key`) halved into int64's negative range."""
    return [t if t >= 0 else -1 - ((-1 - t) >> 1) for t in key]


def _arrays(layer: Any) -> list[mx.array] | None:
    """A layer's KV arrays, `offset` long (None: a kind the disk tier does not store)."""
    if is_plain_kv(layer):
        parts = [layer.keys, layer.values]
    elif type(layer) is QuantizedKVRow:
        parts = [*layer.keys, *layer.values]
    else:
        return None
    offset = int(layer.offset)
    return [p if p.shape[SEQUENCE_AXIS] == offset else p[..., :offset, :] for p in parts]


def open_disk_kv(
    config: EngineConfig, model: LoadedModel, make_cache: CacheFactory, wake: Callable[[], None]
) -> DiskKV | None:
    """`model`'s disk tier in `config.prompt_cache_dir`, its directory's scan begun (None:
    none asked for, a bound of 0 bytes, serving across devices, or this model's KV has
    layers the tier does not store). Runs the model on one token: engine thread. Raises
    OSError for a directory it cannot make."""
    directory = config.prompt_cache_dir
    if directory is None or not config.prompt_cache_disk_bytes or config.distribution:
        return None
    layout = kv_layout(model.model, make_cache)
    if layout is None:
        log.warning("no prefix cache on disk: this model's KV cache has layers it cannot store")
        return None
    block = config.prompt_cache_disk_block
    identity = model_identity(model, layout, block=block, fused=config.fuse_weights)
    tier = DiskTier(
        Path(directory),
        max_bytes=config.prompt_cache_disk_bytes,
        identity=identity,
        layout=layout,
        block=block,
        wake=wake,
    )
    return DiskKV(tier, lambda: make_cache(model.model), config.prompt_cache_disk_read_rate)
