"""Faults inside the server's own code, for one request: the seam of `fault_points`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..fault_points import POINTS, Point, arm, disarm

__all__ = ["POINTS", "Point", "injected_fault"]


@contextmanager
def injected_fault(point: Point, request_id: str) -> Iterator[None]:
    """Within the block, the server's code at `point` raises for the request whose
    `x-request-id` is `request_id` (an in-process server: `start_server`, or `serve` in the
    test's own Trio run). What that request gets is what an unexpected failure there gives:
    a 500 `internal_error` or an error event, and no other request is touched."""
    arm(point, request_id)
    try:
        yield
    finally:
        disarm(point, request_id)
