"""Streaming detokenizers: mlx-lm's, with the BPE one made linear in the text held back.

mlx-lm's `BPEStreamingDetokenizer` holds text back while it ends in an incomplete UTF-8
sequence, and re-decodes all of it, character by character in Python, on every token. A
run of tokens that keeps ending that way is held back whole, so each token costs the
length of the run: quadratic. Real models do that in degenerate output (a repeated
partial-byte token), and every random-weight model of this project does it at once. On
the dev machine such a run cost 29 us per token on average over 1000 tokens and 161 us over
4000 (this one: 1.3 and 2.0 us; on ordinary text both take 1.6 us), on the engine thread,
holding the GIL that the whole batch and the Trio thread need.

Nor does it rebuild the whole text on every token, as mlx-lm's detokenizers do
(`self.text += segment`): that allocates a copy of the text per token, and once the copy
passes 1 KB, glibc's malloc serves it from its large bins, first consolidating every small
block freed since the last time. Between the steps of an MLX model that is a great many: on
the dev machine a 1.1 KB allocation there took 30 us, against 2.6 us at 960 bytes. So the
text is kept in pieces, read through `last_segment`, and joined every `_JOIN_AFTER` pieces.

`LinearBPEDetokenizer` keeps mlx-lm's behaviour exactly (the same text, in the same
segments, at the same tokens) but decodes each token's bytes once, with an incremental
UTF-8 decoder: it gives what decoding all the held bytes at once gives, and keeps only an
incomplete trailing sequence (at most 3 bytes) pending. The byte mapping, including
mlx-lm's quirks, is reproduced, and a test compares both on random token runs.
"""

from __future__ import annotations

import codecs
import re
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, StreamingDetokenizer

try:  # mlx-lm's GPT-2 byte table; private, so its absence means: use mlx-lm's detokenizer
    from mlx_lm.tokenizer_utils import _byte_decoder
except ImportError:  # pragma: no cover - depends on the installed mlx-lm
    _byte_decoder = None

_SPACE = 32
_JOIN_AFTER = 256
"""Segments kept as pieces before they are joined into one string (see the module's doc)."""


def make_detokenizer(tokenizer: Any, *, trim_space: bool = True) -> StreamingDetokenizer:
    """A fresh streaming detokenizer for one request (`tokenizer` is mlx-lm's wrapper).

    `trim_space` drops one space from the start of the text, as mlx-lm's detokenizers do;
    without it the text is the exact continuation of the prompt."""
    detokenizer = tokenizer.detokenizer
    if isinstance(detokenizer, BPEStreamingDetokenizer) and _byte_decoder is not None:
        return LinearBPEDetokenizer(detokenizer.tokenmap, trim_space=trim_space)
    if hasattr(detokenizer, "trim_space"):  # mlx-lm's SentencePiece detokenizer
        detokenizer.trim_space = trim_space
    return detokenizer


_WHOLE: dict[int, tuple[list[str], dict[int, str | None]]] = {}
"""Per tokenmap (by identity, kept alive here): each token id seen so far -> its text when
its bytes are whole UTF-8 on their own (None when they are not: held back, or a lone space)."""


def _whole_texts(tokenmap: list[str]) -> dict[int, str | None]:
    entry = _WHOLE.get(id(tokenmap))
    if entry is None or entry[0] is not tokenmap:
        entry = _WHOLE[id(tokenmap)] = (tokenmap, {})
    return entry[1]


class LinearBPEDetokenizer(StreamingDetokenizer):  # type: ignore[misc]  # untyped base
    def __init__(self, tokenmap: list[str], *, trim_space: bool = True) -> None:
        self._tokenmap = tokenmap  # shared, read-only: the wrapper's copy for this tokenizer
        self._trim_space = trim_space
        self._byte_of: dict[str, int] = _byte_decoder()
        self._whole = _whole_texts(tokenmap)
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        self._read: list[str] = []
        """Text already returned by `last_segment`, in pieces, joined every `_JOIN_AFTER`."""
        self._unread: list[str] = []
        self._held_chars: list[str] = []
        """The held tokens' strings, for `finalize`, which maps them as mlx-lm does there."""
        self._held_text: list[str] = []
        """The held tokens decoded so far, in non-empty pieces."""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add_token(self, token: int) -> None:
        if not self._held_chars:  # the usual token: nothing held, its text known
            whole = self._whole.get(token)
            if whole is not None:
                self.tokens.append(token)
                self._append(whole)  # nothing to reset: nothing was held
                return
        self.tokens.append(token)
        v = self._tokenmap[token] if token < len(self._tokenmap) else "!"  # as mlx-lm
        if not self._held_chars and token not in self._whole:
            self._whole[token] = self._whole_text(v)
        self._held_chars.append(v)
        decoded = self._decoder.decode(self._bytes(v, table_zero=False))
        if decoded:
            self._held_text.append(decoded)
        pending = self._decoder.getstate()[0]
        # mlx-lm: hold while the held text, decoded at once, ends in U+FFFD (an incomplete
        # sequence pending always does), and hold a single-space token for one more token.
        if pending or (self._held_text and self._held_text[-1][-1] == "\ufffd"):
            return
        if len(v) == 1 and self._byte_of.get(v[0]) == _SPACE:
            return
        self._flush("".join(self._held_text))

    def _append(self, text: str) -> None:
        if self._trim_space and text and text[0] == " " and not (self._read or self._unread):
            text = text[1:]
        if text:
            self._unread.append(text)

    def _whole_text(self, v: str) -> str | None:
        """What `add_token` flushes for token text `v` with nothing held; None if it holds."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        decoded = decoder.decode(self._bytes(v, table_zero=False))
        if decoder.getstate()[0] or decoded.endswith("\ufffd"):
            return None
        if len(v) == 1 and self._byte_of.get(v[0]) == _SPACE:
            return None
        return decoded

    def finalize(self) -> None:
        # mlx-lm decodes what is held through the byte table here, byte 0 included; a
        # character outside the table keeps its UTF-8 bytes (mlx-lm would raise).
        held = self._bytes("".join(self._held_chars), table_zero=True)
        self._flush(held.decode("utf-8", "replace"))

    def _bytes(self, chars: str, *, table_zero: bool) -> bytes:
        """Map byte-level characters to bytes, as mlx-lm does; a character outside the table
        keeps its UTF-8 bytes. mlx-lm's `add_token` skips the table's byte 0 (a falsy value)
        and `finalize` does not: `table_zero` says which."""
        data = bytearray()
        for c in chars:
            value = self._byte_of.get(c)
            if value is not None and (value or table_zero):
                data.append(value)
            else:
                data.extend(c.encode("utf-8"))
        return bytes(data)

    @property
    def text(self) -> str:
        """The whole text so far: joined on demand (the engine reads only `last_segment`)."""
        return "".join(self._read + self._unread)

    @property
    def last_segment(self) -> str:
        segment = self._unread[0] if len(self._unread) == 1 else "".join(self._unread)
        self._unread = []
        if segment:
            self._read.append(segment)
            if len(self._read) >= _JOIN_AFTER:
                self._read = ["".join(self._read)]
        return segment

    def _flush(self, text: str) -> None:
        self._append(text)
        self._held_chars = []
        self._held_text = []
        self._decoder.reset()


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPM_SPACE = "\u2581"


class TokenBytes:
    """A token id's exact bytes: what it stands for in the text, a partial UTF-8 sequence
    included (logprobs' `bytes`, from which clients rebuild characters split across tokens).

    Byte-level BPE: the token's characters through the GPT-2 byte table, as the detokenizer
    maps them. SentencePiece: `<0xNN>` pieces are that byte, `▁` a space. Computed per
    token on first use and kept (at most one entry per vocabulary id)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        detokenizer = tokenizer.detokenizer
        bpe = isinstance(detokenizer, BPEStreamingDetokenizer) and _byte_decoder is not None
        self._tokenmap: list[str] | None = detokenizer.tokenmap if bpe else None
        self._byte_of: dict[str, int] = _byte_decoder() if bpe else {}
        self._known: dict[int, bytes] = {}

    def __call__(self, token: int) -> bytes:
        known = self._known.get(token)
        if known is None:
            known = self._known[token] = self._bytes(token)
        return known

    def _bytes(self, token: int) -> bytes:
        if self._tokenmap is not None:
            chars = self._tokenmap[token] if 0 <= token < len(self._tokenmap) else ""
            data = bytearray()
            for c in chars:
                value = self._byte_of.get(c)
                # As the detokenizer's text has it: outside the table (a special token's
                # text), and the table's byte 0 (mlx-lm's quirk), a character keeps its UTF-8.
                if value:
                    data.append(value)
                else:
                    data.extend(c.encode("utf-8"))
            return bytes(data)
        piece = self._tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str):
            byte = _BYTE_PIECE.fullmatch(piece)
            if byte:
                return bytes([int(byte.group(1), 16)])
            if _SPM_SPACE in piece:
                return piece.replace(_SPM_SPACE, " ").encode("utf-8")
        return str(self._tokenizer.decode([token])).encode("utf-8", "replace")
