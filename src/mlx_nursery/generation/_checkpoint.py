"""Where a request's preparation may stop early: between its costly steps.

Preparation runs on a worker thread that Trio abandons when the request is cancelled (a
disconnect, its deadline): the client gets its answer at once, but the thread runs on, and
holds its preparation slot, until it reaches a check. So each costly step (an image's
decoding, a second of audio, a render of a truncated conversation) is preceded by one.
"""

from __future__ import annotations

import trio


def checkpoint() -> None:
    """Raise `trio.Cancelled` if the request this thread prepares was cancelled. A no-op off
    a thread of `trio.to_thread.run_sync` (tools, unit tests). Not a Trio checkpoint: it
    never yields, and runs on the worker thread."""
    try:
        trio.from_thread.check_cancelled()
    except RuntimeError:  # not a Trio worker thread: nothing can cancel this work
        return
