"""Tokenizing rendered prompts a segment at a time, keeping the long segments seen before.

Agent clients send the whole conversation every turn, and preparation tokenized all of it
every time (what a long shared prefix cost, and costs now: `bench/tokenizing.py`,
docs/benchmarks.md). A fast tokenizer cuts text at its added tokens (`<|im_start|>`,
`<|im_end|>`, ...) before anything else and tokenizes each piece between them on its own; so
the ids of a long piece (a system prompt, a message, a tool schema) are the same wherever it
appears, and can be kept.

That holds only for tokenizers that treat each piece alike: no added token that strips or
matches the whitespace around it, no pre-tokenizer that marks only the first piece (a
Metaspace "first" prefix). `SegmentEncoder` checks the tokenizer it is given at startup
on sample text and turns itself off (whole-text encoding) unless it gives the same ids.
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from typing import Any

MIN_CACHED_CHARS = 256
"""Pieces shorter than this are tokenized each time (cheap; not worth an entry)."""
MAX_CACHED_BYTES = 8 << 20
"""What the cached pieces may hold together: their text (UTF-8) and their ids (4 bytes each).
A bound in bytes, not entries or characters: a soak of unique prompts fills it, and the
process's memory must not grow past it (ids are kept as packed arrays, not lists of Python
ints, which cost 8-36 bytes each)."""

_CHECK_TEXTS = (
    "plain text, then more",
    " leading space and trailing space ",
    "\nnew lines\n\nand tabs\t here\n",
    "numbers 12345 67.89 and émigré naïve 漢字 🙂",
    '{"json": [1, 2, {"a": "b"}]}',
)


class SegmentEncoder:
    """`encode(text)` as `tokenizer.encode(text, add_special_tokens=False)`, from cached
    pieces where it can (see the module docstring). Thread-safe: the preparation threads
    share it (a lock guards the cache; encodes run outside it)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        added = _added_tokens(tokenizer)
        self._ids = {token.content: index for index, token in added.items()}
        self._cache: OrderedDict[str, array[int]] = OrderedDict()
        self._lock = threading.Lock()
        """Guards the cache: preparations run on several threads at once."""
        self.cached_bytes = 0
        """What the kept pieces hold now (text and ids), at most `MAX_CACHED_BYTES`."""
        self.hits = 0
        """Pieces served from the cache (for tests and statistics)."""
        plain = all(
            not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values()
        )
        self._split = (
            re.compile(
                "(" + "|".join(re.escape(t) for t in sorted(self._ids, key=len, reverse=True)) + ")"
            )
            if self._ids and plain
            else None
        )
        self.enabled = self._split is not None and self._agrees() and self._chat_agrees()
        """False: every text is encoded whole, as the tokenizer does."""

    def encode(self, text: str) -> list[int]:
        return self._pieces(text) if self.enabled else self._whole(text)

    def _pieces(self, text: str) -> list[int]:
        assert self._split is not None
        ids: list[int] = []
        for piece in self._split.split(text):
            if not piece:
                continue
            special = self._ids.get(piece)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(self._piece(piece))
        return ids

    def _piece(self, piece: str) -> list[int] | array[int]:
        if len(piece) < MIN_CACHED_CHARS:
            return self._whole(piece)
        with self._lock:
            cached = self._cache.get(piece)
            if cached is not None:
                self._cache.move_to_end(piece)
                self.hits += 1
                return cached
        ids = array("i", self._whole(piece))  # outside the lock: encodes run side by side
        with self._lock:
            if piece in self._cache:  # another preparation kept it meanwhile
                return ids
            self._cache[piece] = ids
            self.cached_bytes += _cost(piece, ids)
            while self.cached_bytes > MAX_CACHED_BYTES:
                oldest, oldest_ids = self._cache.popitem(last=False)
                self.cached_bytes -= _cost(oldest, oldest_ids)
        return ids

    def _whole(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _agrees(self) -> bool:
        """Whether piecewise encoding gives this tokenizer's own ids on sample text that
        puts every added token between pieces of every kind."""
        specials = list(self._ids)
        texts = [
            f"{a}{s}{b}"
            for s in specials
            for a, b in zip(_CHECK_TEXTS, (*_CHECK_TEXTS[1:], _CHECK_TEXTS[0]), strict=True)
        ]
        texts.append("".join(f"{t}{s}" for t, s in zip(_CHECK_TEXTS * 4, specials, strict=False)))
        try:
            return all(self._pieces(t) == self._whole(t) for t in texts)
        except Exception:  # noqa: BLE001 - a tokenizer this cannot read is encoded whole
            return False

    def _chat_agrees(self) -> bool:
        """Whether the chat template's own tokenizing (`tokenize=True`) is this encoding of
        its text, as the prompts module relies on."""
        messages = [
            {"role": "system", "content": _CHECK_TEXTS[0]},
            {"role": "user", "content": _CHECK_TEXTS[3]},
            {"role": "assistant", "content": _CHECK_TEXTS[1]},
            {"role": "user", "content": _CHECK_TEXTS[2]},
        ]
        try:
            text = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            ids = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
        except Exception:  # noqa: BLE001 - no usable template: chat prompts are not rendered here
            return False
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return isinstance(text, str) and self._pieces(text) == list(ids)


def _cost(piece: str, ids: array[int]) -> int:
    return len(piece.encode()) + ids.itemsize * len(ids)


def _added_tokens(tokenizer: Any) -> dict[int, Any]:
    """The added tokens of a Hugging Face tokenizer, or of the one mlx-lm's wrapper holds."""
    for candidate in (tokenizer, getattr(tokenizer, "_tokenizer", None)):
        decoder = getattr(candidate, "added_tokens_decoder", None)
        if isinstance(decoder, dict):
            return dict(decoder)
    return {}
