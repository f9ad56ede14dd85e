"""Rank 0's broadcast to the other ranks, over MLX's own collectives (no transport of ours).

A record is bytes (JSON): rank 0 sums its bytes with the others' zeros (`all_sum`, as
mlx-lm's `_share_object` does), so every rank ends with rank 0's. One fixed-size frame
carries the length and, in the common case, the whole record: one collective per record;
a longer one takes a second for the rest. Every collective runs on mlx-lm's generation
stream, the stream the steps' own collectives run on, so that every rank issues them all in
one order; each is watched (`Watchdog`).

Rank 0 needs nothing back from a record it sends before a step (`post`): it queues the
collective and goes on to launch the step, as on one device, instead of waiting for the
previous step to finish on its device (the stream runs in order). Waiting there made every
served step cost the device's step plus the host's build and launch of the next. The
followers read each record (they must, to build their step); a follower that never joins
shows as a stalled step on rank 0.
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
        self._posted: list[mx.array] = []
        """The last posted record's collectives, held until the next post."""

    @property
    def rank(self) -> int:
        return self.group.rank()

    def send(self, record: Any) -> None:
        """Rank 0: broadcast `record` (JSON-able) to every other rank and wait until every
        rank has it. Blocks (bounded by the watchdog); not cancellable."""
        for part in _frames(record):
            self._sum(part, "a broadcast")

    def post(self, record: Any) -> None:
        """Rank 0: broadcast `record` without waiting: its collectives are queued on the
        generation stream, ahead of whatever is queued next there (the step). Returns at
        once; a rank that does not join stalls the next wait on the stream (watched there)."""
        self._posted = []
        with mx.stream(generation_stream):
            for part in _frames(record):
                # One launch per frame, in order: the followers sum them one after the other,
                # and one launch of independent collectives may run them in any order.
                self._posted.append(mx.distributed.all_sum(mx.array(part), group=self.group))
                mx.async_eval(self._posted[-1])  # type: ignore[no-untyped-call]

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


def _frames(record: Any) -> list[np.ndarray[Any, Any]]:
    """`record` as the frames a broadcast sums: the fixed frame (length and the record's
    head), then the rest if it did not fit."""
    payload = json.dumps(record, separators=(",", ":")).encode()
    head = len(payload).to_bytes(_HEADER, "little") + payload[: FRAME_BYTES - _HEADER]
    frame = np.zeros(FRAME_BYTES, np.uint8)
    frame[: len(head)] = np.frombuffer(head, np.uint8)
    rest = payload[FRAME_BYTES - _HEADER :]
    return [frame, np.frombuffer(rest, np.uint8)] if rest else [frame]
