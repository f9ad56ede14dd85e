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

Over NCCL a follower's read of the record on the step's stream would wait for the step in
flight to finish, and only then could it build the next: every step would cost the device's
time plus that rank's building. So there the records travel apart (`separate_records`): a
second group of MLX's ring backend, beside the NCCL one, on the CPU stream, whose sums wait
for nothing on the GPU. Each transport keeps its own order, and every rank issues both in
the same order, so neither can cross the other.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import tempfile
from pathlib import Path
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
        self._records = group
        """The group the records travel on: the steps' own, or a ring beside NCCL."""
        self._stream: mx.Stream | mx.ThreadLocalStream = generation_stream
        self._posted: list[mx.array] = []
        """The last posted record's collectives, held until the next post."""

    def separate_records(self) -> bool:
        """Over NCCL (`mlx.launch --backend nccl`), move the records to a group of MLX's
        ring backend on the CPU stream (the module's docstring says why); elsewhere leave
        them where they are. Collective: every rank calls it once, first. Returns whether
        they moved. The ring's ports follow NCCL's (`NCCL_PORT` + 1 + rank)."""
        host, port = os.environ.get("NCCL_HOST_IP"), os.environ.get("NCCL_PORT")
        if host is None or port is None or not mx.cuda.is_available():
            return False
        with self.watchdog.watching("the records' group"):
            mine = int(ipaddress.IPv4Address(_own_address(host, int(port))))
            addresses = [row[0] for row in self.gather([mine], "the records' group")]
            hosts = [
                [f"{ipaddress.IPv4Address(address)}:{int(port) + 1 + rank}"]
                for rank, address in enumerate(addresses)
            ]
            path = Path(tempfile.gettempdir()) / f"mlx-nursery-records-{port}-{self.rank}.json"
            path.write_text(json.dumps(hosts))
            os.environ["MLX_HOSTFILE"] = str(path)
            self._records = mx.distributed.init(strict=True, backend="ring")
            # Its own stream and thread in each thread that sends or reads: behind nothing else.
            self._stream = mx.new_thread_local_stream(mx.cpu)
            self._sum(np.zeros(1, np.uint8), "the records' group")  # every rank connected
        return True

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
        for part in _frames(record):
            # One launch per frame, in order: the followers sum them one after the other,
            # and one launch of independent collectives may run them in any order.
            self._posted.append(self._all_sum(part))
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
        with self.watchdog.watching(what):
            out = self._all_sum(data)
            mx.eval(out)
        return np.array(out)

    def _all_sum(self, data: np.ndarray[Any, Any]) -> mx.array:
        return mx.distributed.all_sum(mx.array(data), group=self._records, stream=self._stream)


def _own_address(peer: str, port: int) -> str:
    """This host's address on the route to `peer` (a UDP socket's connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, port))
        address: str = probe.getsockname()[0]
        return address


def _frames(record: Any) -> list[np.ndarray[Any, Any]]:
    """`record` as the frames a broadcast sums: the fixed frame (length and the record's
    head), then the rest if it did not fit."""
    payload = json.dumps(record, separators=(",", ":")).encode()
    head = len(payload).to_bytes(_HEADER, "little") + payload[: FRAME_BYTES - _HEADER]
    frame = np.zeros(FRAME_BYTES, np.uint8)
    frame[: len(head)] = np.frombuffer(head, np.uint8)
    rest = payload[FRAME_BYTES - _HEADER :]
    return [frame, np.frombuffer(rest, np.uint8)] if rest else [frame]
