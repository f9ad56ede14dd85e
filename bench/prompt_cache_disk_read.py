"""The prefix cache's disk tier's read path alone, on this machine: one file of synthetic KV
(an 8B Llama's shapes by default: 32 layers, 8 KV heads of 128, bfloat16, 131,072 bytes a
token) written through the tier's own writer thread, then read back through its reader
thread (header, checks, checksum, tokens) and copied into MLX arrays as the engine thread
does (`Restoring`), `--rounds` times, against the raw read of the same file from the page
cache in the same run (`numpy.fromfile`: into a fresh buffer, as the tier reads; `dd`: into
one small buffer, the copy out of the page cache alone).

The file holds `--tokens` tokens; the read serves all but the last 8 (a stored sequence
holds its generated tokens too, which a new question does not share), as a restart's
first request does.

Usage:
  python -P bench/prompt_cache_disk_read.py                     # 8192 tokens: 1 GiB
  python -P bench/prompt_cache_disk_read.py --tokens 16384 --dir /tmp
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from mlx_nursery.engine._disk_entries import DiskRead, DiskWrite
from mlx_nursery.engine._disk_format import Layout, block_chain, file_name, namespace_root
from mlx_nursery.engine._disk_kv import Restoring
from mlx_nursery.engine._disk_tier import DiskTier
from mlx_nursery.engine._upstream import KVCache

SERVED_SHORT_OF_FILE = 8
BLOCK = 256


def make_tier(directory: Path, layout: Layout) -> DiskTier:
    tier = DiskTier(
        directory,
        max_bytes=1 << 40,
        identity="b" * 32,
        layout=layout,
        block=BLOCK,
        wake=lambda: None,
    )
    tier.wait_ready()
    return tier


def write_file(directory: Path, layout: Layout, key: list[int], seed: int) -> tuple[Path, float]:
    """The file of `key`'s KV (random bits), through the writer thread; its write time."""
    tier = make_tier(directory, layout)
    root = namespace_root(tier.identity, "bench")
    chain = tuple(block_chain(root, key, BLOCK))
    rng = np.random.default_rng(seed)
    tensors: list[tuple[str, str, np.ndarray]] = [("tokens", "I64", np.asarray(key, np.int64))]
    for name, dtype, shape in layout.tensors:
        full = (*shape[:2], len(key), *shape[3:])
        tensors.append((name, dtype, rng.integers(0, 1 << 16, full, dtype=np.uint16)))
    metadata = {
        "format": "mlx-nursery-prefix-kv",
        "version": _version(),
        "identity": tier.identity,
        "root": root.hex(),
        "chain": ",".join(h.hex() for h in chain),
        "tokens": str(len(key)),
    }
    name = file_name(tier.identity, chain[-1])
    nbytes = sum(t.nbytes for _, _, t in tensors)
    started = time.perf_counter()
    assert tier.write(DiskWrite(1, name, chain, metadata, tensors, nbytes))
    tier.close()  # waits for the write
    return directory / name, time.perf_counter() - started


def _version() -> str:
    from mlx_nursery.engine import _disk_format

    version: str = _disk_format.VERSION
    return version


def read_once(directory: Path, layout: Layout, key: list[int]) -> dict[str, float]:
    """A fresh tier (a restart: its scan indexes the file) reads the file and the engine's
    copy makes MLX arrays of it; seconds of each part."""
    tier = make_tier(directory, layout)
    request = key[: len(key) - SERVED_SHORT_OF_FILE] + list(range(3, 19))
    root = namespace_root(tier.identity, "bench")
    found = tier.find(block_chain(root, request, BLOCK))
    assert found is not None
    read = DiskRead(found[0], root.hex(), request, found[1], limit=len(request) - 1)
    started = time.perf_counter()
    tier.read(read)
    read.done.wait()
    read_s = time.perf_counter() - started
    assert read.kv is not None, "the read served nothing"
    started = time.perf_counter()
    restoring = Restoring(read.kv, layout, [KVCache() for _ in range(len(layout.tensors) // 2)])
    restoring.advance(None)
    mx.eval([a for c in restoring.cache for a in (c.keys, c.values)])
    copy_s = time.perf_counter() - started
    tier.close()
    return {"read_s": read_s, "copy_s": copy_s, "served_tokens": read.kv.tokens}


def raw_reads(path: Path) -> dict[str, float]:
    started = time.perf_counter()
    data = np.fromfile(path, dtype=np.uint8)
    fromfile_s = time.perf_counter() - started
    del data
    started = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"], capture_output=True, check=True)
    dd_s = time.perf_counter() - started
    return {"fromfile_s": fromfile_s, "dd_s": dd_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the file goes (a disk)")
    parser.add_argument("--out", default="bench/results/prompt_cache_disk_read.json")
    args = parser.parse_args()

    shape = (1, args.kv_heads, 0, args.head_dim)
    layout = Layout(
        tuple((f"{i}.{j}", "BF16", shape) for i in range(args.layers) for j in range(2))
    )
    key = [int(t) for t in np.random.default_rng(0).integers(10, 30000, args.tokens)]
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path, write_s = write_file(Path(tmp), layout, key, seed=1)
        size = path.stat().st_size
        raw_reads(path)  # into the page cache, off the record
        for _ in range(args.rounds):
            rounds.append({**raw_reads(path), **read_once(Path(tmp), layout, key)})
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    served = med["served_tokens"] / args.tokens * size
    gbs = {
        "raw_fromfile_gb_s": size / med["fromfile_s"] / 1e9,
        "raw_dd_gb_s": size / med["dd_s"] / 1e9,
        "tier_read_gb_s": size / med["read_s"] / 1e9,
        "copy_into_mlx_gb_s": served / med["copy_s"] / 1e9,
        "read_and_copy_gb_s": size / (med["read_s"] + med["copy_s"]) / 1e9,
        "write_gb_s": size / write_s / 1e9,
    }
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    meta = {
        "device": str(mx.default_device()),
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "file_bytes": size,
        "args": vars(args),
    }
    print(f"disk tier read path: {size / 1e9:.2f} GB file, {args.tokens} tokens, {commit}")
    print(f"median of {args.rounds} rounds, GB/s of the file's bytes:")
    for name, value in gbs.items():
        print(f"  {name:>20}: {value:6.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "gb_s": gbs, "rounds": rounds}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
