"""Stop strings matched on text, across token boundaries, with nothing of them leaked.

The matcher holds back the longest tail of the text that could still grow
into a stop string; that tail is released once it cannot, and discarded
when it does. mlx-lm matches stop words on token ids, which misses a stop
string that tokenizes differently in context; text matching does not.
"""

from __future__ import annotations

import attrs


@attrs.define
class StopMatcher:
    stops: tuple[str, ...]
    _pending: str = ""
    stopped: bool = False
    matched: str | None = None
    """The stop string that ended the text (the earliest in it; None: none did)."""

    def feed(self, text: str) -> str:
        """Add generated text; return what is safe to emit. Sets `stopped` on a match."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._pending + text
        found = _earliest_match(buffer, self.stops)
        if found is not None:
            cut, self.matched = found
            self.stopped = True
            self._pending = ""
            return buffer[:cut]
        keep = _partial_tail(buffer, self.stops)
        self._pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The generation ended without a match: release what was held back."""
        pending, self._pending = self._pending, ""
        return "" if self.stopped else pending


def _earliest_match(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Where the earliest stop string starts in `text`, and which it is."""
    found = [(i, s) for s, i in ((s, text.find(s)) for s in stops) if i >= 0]
    return min(found, key=lambda match: match[0]) if found else None


def _partial_tail(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest
