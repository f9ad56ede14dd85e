"""The disk tier's block reads on a pool of threads (engine/_disk_read.py), which a 2-core
machine never runs through the engine (it reads on the reader thread alone): the same
arrays as one thread reads, a stop honoured, a damaged block refused."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from mlx_nursery.engine._disk_format import CHECK_BLOCK, FileRejected, read_header, write_entry
from mlx_nursery.engine._disk_read import ReadStopped, read_data


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def _file(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 1 << 16, (1, 2, 3000, 256), dtype=np.uint16) for _ in range(4)]
    tensors = [("tokens", "I64", np.arange(3000, dtype=np.int64))]
    tensors += [(f"0.{i}", "BF16", a) for i, a in enumerate(arrays)]
    metadata = {"format": "mlx-nursery-prefix-kv", "version": "2", "identity": "x",
                "root": "00", "chain": "", "tokens": "3000"}  # fmt: skip
    write_entry(tmp_path, "f.kv.safetensors", metadata, tensors)
    return tmp_path / "f.kv.safetensors", arrays


def test_a_pool_reads_what_one_thread_reads_stops_and_refuses_a_damaged_block(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    path, arrays = _file(tmp_path)
    header = read_header(path)
    assert len(header.crc32) == -(-header.data_bytes // CHECK_BLOCK) > 1
    tokens, read = read_data(path, header, pool=pool)
    assert tokens.tolist() == list(range(3000))
    assert all(np.array_equal(a, b) for a, b in zip(arrays, read, strict=True))
    with pytest.raises(ReadStopped):
        read_data(path, header, pool=pool, stop=lambda: True)
    data = bytearray(path.read_bytes())
    data[header.data_start + CHECK_BLOCK + 5] ^= 0x10  # the second block
    path.write_bytes(bytes(data))
    with pytest.raises(FileRejected):
        read_data(path, header, pool=pool)
