"""Logprobs that line up with the content the client receives.

Each engine token event carries its text segment and its logprob; content reaches the client
later and may be cut (a stop string) but is always a prefix of the concatenated segments.
`LogprobAligner` hands out a token's entry once all of its text has been emitted, so the
entries' tokens concatenate to exactly the content; a token cut by a stop string keeps only
its emitted part.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from ..engine import TokenLogprob


@attrs.frozen
class LogprobEntry:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]

    def chat(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "bytes": list(self.token.encode()),
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in self.top]}


class LogprobAligner:
    def __init__(self, token_text: Callable[[int], str]) -> None:
        self._token_text = token_text
        self._pending: deque[tuple[str, TokenLogprob]] = deque()
        self._raw_popped = 0  # chars of the pending tokens' text already handed out
        self._emitted = 0

    def add(self, text: str, logprob: TokenLogprob) -> None:
        self._pending.append((text, logprob))

    def take(self, emitted: str) -> list[LogprobEntry]:
        """`emitted` more characters of content went out: the entries now fully covered."""
        self._emitted += len(emitted)
        entries = []
        while self._pending and self._raw_popped + len(self._pending[0][0]) <= self._emitted:
            text, logprob = self._pending.popleft()
            self._raw_popped += len(text)
            entries.append(self._entry(text, logprob))
        return entries

    def finish(self) -> list[LogprobEntry]:
        """The content ended: a token straddling the end keeps its emitted part; the rest go."""
        entries = []
        if self._pending and self._raw_popped < self._emitted:
            text, logprob = self._pending.popleft()
            entries.append(self._entry(text[: self._emitted - self._raw_popped], logprob))
        self._pending.clear()
        return entries

    def _entry(self, text: str, logprob: TokenLogprob) -> LogprobEntry:
        top = tuple((self._token_text(token), value) for token, value in logprob.top)
        return LogprobEntry(text, logprob.logprob, top)
