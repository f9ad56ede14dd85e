"""Rank 0's broadcast to the other ranks, over MLX's own collectives (no transport of ours).

A record is bytes (JSON): rank 0 sums its bytes with the others' zeros (`all_sum`, as
mlx-lm's `_share_object` does), so every rank ends with rank 0's. One fixed-size frame
carries the length and, in the common case, the whole record: one collective per record;
a longer one takes a second for the rest. Every collective runs on mlx-lm's generation
stream, the stream the steps' own collectives run on, so that every rank issues them all in
one order; each is watched (`Watchdog`).
"""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.stepping import generation_stream
from ._watchdog import Watchdog

FRAME_BYTES = 4096
_HEADER = 4


class Channel:
    def __init__(self, group: mx.distributed.Group, watchdog: Watchdog) -> None:
        self.group = group
        self.watchdog = watchdog

    @property
    def rank(self) -> int:
        return self.group.rank()

    def send(self, record: Any) -> None:
        """Rank 0: broadcast `record` (JSON-able) to every other rank."""
        payload = json.dumps(record, separators=(",", ":")).encode()
        head = len(payload).to_bytes(_HEADER, "little") + payload[: FRAME_BYTES - _HEADER]
        frame = np.zeros(FRAME_BYTES, np.uint8)
        frame[: len(head)] = np.frombuffer(head, np.uint8)
        self._sum(frame, "a broadcast")
        rest = payload[FRAME_BYTES - _HEADER :]
        if rest:
            self._sum(np.frombuffer(rest, np.uint8), "a broadcast")

    def receive(self) -> Any:
        """Ranks > 0: the next record rank 0 sends."""
        frame = self._sum(np.zeros(FRAME_BYTES, np.uint8), "rank 0's next record")
        length = int.from_bytes(frame[:_HEADER].tobytes(), "little")
        payload = frame[_HEADER : _HEADER + length].tobytes()
        if length > FRAME_BYTES - _HEADER:
            rest = length - (FRAME_BYTES - _HEADER)
            payload += self._sum(np.zeros(rest, np.uint8), "rank 0's next record").tobytes()
        return json.loads(payload)

    def gather(self, values: list[int], what: str) -> list[list[int]]:
        """Every rank's `values` (int64, the same length on each), by rank."""
        mine = np.array(values, np.int64)
        with self.watchdog.watching(what), mx.stream(generation_stream):
            out = mx.distributed.all_gather(mx.array(mine), group=self.group)
            mx.eval(out)
        rows: list[list[int]] = np.array(out).reshape(self.group.size(), len(values)).tolist()
        return rows

    def _sum(self, data: np.ndarray[Any, Any], what: str) -> np.ndarray[Any, Any]:
        with self.watchdog.watching(what), mx.stream(generation_stream):
            out = mx.distributed.all_sum(mx.array(data), group=self.group)
            mx.eval(out)
        return np.array(out)
