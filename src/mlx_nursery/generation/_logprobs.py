"""Logprobs that line up with the content the client receives.

Each engine token event carries its text segment and its logprob; content reaches the client
later and may be cut (a stop string) but is always a prefix of the concatenated segments.
`LogprobAligner` hands out a token's entry once its segment has been emitted; a token cut by
a stop string keeps only its emitted part.

An entry's `token` is the token's own text (as OpenAI's are), not its segment: the streaming
detokenizer may hold a token's text back and release it with a later token's (a lone space
waits for the word after it), so a segment can hold two tokens' text and another none. The
own text is the token's bytes through one incremental UTF-8 decoder for the whole output,
so the entries' tokens still concatenate to the content.

`bytes` are the token's own bytes, not the UTF-8 of its text: a token holding part of a
multi-byte character has the text "" (its character comes out with the token that
completes it) and the bytes it stands for, so the entries' bytes concatenate to the UTF-8
of the content. Two exceptions keep that true: a token cut by a stop string has the bytes
of its emitted part, and a chat reply's leading space, dropped from its text, is dropped
from its bytes.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from ..engine import TokenLogprob


@attrs.frozen
class LogprobEntry:
    token: str
    logprob: float
    top: tuple[tuple[str, float, bytes], ...]
    """(token text, logprob, token bytes), most likely first."""
    bytes: bytes = b""

    def chat(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "logprob": self.logprob,
            "bytes": list(self.bytes),
            "top_logprobs": [
                {"token": t, "logprob": lp, "bytes": list(b)} for t, lp, b in self.top
            ],
        }


class LogprobAligner:
    def __init__(
        self,
        token_text: Callable[[int], str],
        token_bytes: Callable[[int], bytes] | None = None,
        *,
        trimmed_space: bool = False,
    ) -> None:
        """`trimmed_space`: the text lost one leading space (a chat reply's), so the bytes do."""
        self._token_text = token_text
        self._token_bytes = token_bytes or (lambda token: token_text(token).encode())
        self._trim = trimmed_space  # nothing of the output seen yet: its first space goes
        self._pending: deque[tuple[str, str, bytes, TokenLogprob]] = deque()
        """Each added token's segment, own text and bytes, and logprob, until handed out."""
        self._raw_popped = 0  # chars of the pending tokens' segments already handed out
        self._emitted = 0
        self._shown = 0  # chars of the entries' tokens handed out
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, text: str, logprob: TokenLogprob, *, exact: bool = True) -> None:
        """A token's content `text` (its segment); not `exact` when that is only part of the
        token's text (its text and bytes are then the segment's own)."""
        data = self._token_bytes(logprob.token_id)
        own = self._decoder.decode(data)  # fed every token, so later ones decode right
        if not exact:
            own, data = text, text.encode()
        if self._trim and data:
            # The detokenizer drops one space from the start of the text, which it does when
            # the first byte of the output is one: the first token's text and bytes lose it.
            if exact and data.startswith(b" "):
                own, data = own.removeprefix(" "), data[1:]
            self._trim = False
        self._pending.append((text, own, data, logprob))

    def take(self, emitted: str) -> list[LogprobEntry]:
        """`emitted` more characters of content went out: the entries now fully covered."""
        self._emitted += len(emitted)
        entries = []
        while self._pending and self._raw_popped + len(self._pending[0][0]) <= self._emitted:
            text, own, data, logprob = self._pending.popleft()
            self._raw_popped += len(text)
            entries.append(self._entry(own, data, logprob))
        return entries

    def finish(self) -> list[LogprobEntry]:
        """The content ended: a token straddling the end keeps its emitted part (less what
        earlier entries' tokens already showed of it), its bytes that part's; the rest go."""
        entries = []
        if self._pending and self._raw_popped < self._emitted:
            text, _, _, logprob = self._pending.popleft()
            emitted = text[: self._emitted - self._raw_popped]
            unshown = emitted[len(emitted) - max(0, self._emitted - self._shown) :]
            entries.append(self._entry(unshown, unshown.encode(), logprob))
        self._pending.clear()
        return entries

    def _entry(self, text: str, data: bytes, logprob: TokenLogprob) -> LogprobEntry:
        top = tuple(
            (self._token_text(token), value, self._token_bytes(token))
            for token, value in logprob.top
        )
        self._shown += len(text)
        return LogprobEntry(text, logprob.logprob, top, data)
