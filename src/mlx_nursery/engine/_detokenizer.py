"""Streaming detokenizers: mlx-lm's, with the BPE one made linear in the text held back.

mlx-lm's `BPEStreamingDetokenizer` holds text back while it ends in an incomplete UTF-8
sequence, and re-decodes all of it, character by character in Python, on every token. A
run of tokens that keeps ending that way is held back whole, so each token costs the
length of the run: quadratic. Real models do that in degenerate output (a repeated
partial-byte token), and every random-weight model of this project does it at once. Such a
run's cost per token grows with its length (this one's stays flat, as on ordinary text;
docs/architecture.md has the measurements), on the engine thread, holding the GIL that the
whole batch and the Trio thread need.

Nor does it rebuild the whole text on every token, as mlx-lm's detokenizers do
(`self.text += segment`): that allocates a copy of the text per token, and once the copy
passes glibc's large-bin threshold, malloc serves it from its large bins, first
consolidating every small block freed since the last time. Between the steps of an MLX
model that is a great many, and such an allocation costs many times a small one
(measured: docs/architecture.md). So the text is kept in pieces, read through
`last_segment`, and joined every `_JOIN_AFTER` pieces.

`LinearBPEDetokenizer` keeps mlx-lm's behaviour exactly (the same text, in the same
segments, at the same tokens) but decodes each token's bytes once, with an incremental
UTF-8 decoder: it gives what decoding all the held bytes at once gives, and keeps only an
incomplete trailing sequence (at most 3 bytes) pending. The byte mapping, including
mlx-lm's quirks, is reproduced, and a test compares both on random token runs.

One quirk is not: an id the tokenizer has no text for stands for nothing here. Such ids
exist: a hole in the vocabulary (no token has that id), and the ids past the tokenizer's
last, which a model whose embedding rows are padded past its tokenizer (most real ones)
can sample. mlx-lm's BPE detokenizer raises on a hole (its map holds None there), writes
"!" for an id past its map (and its map stops at the tokenizer's length: a vocabulary with
holes has ids past it that do have text), and its SentencePiece one raises IndexError.
`TokenTexts` holds the map of every id the tokenizer has, once per model, and hands out
detokenizers and token bytes that give an id without text no text and no bytes.
"""

from __future__ import annotations

import codecs
import functools
import re
from typing import Any

from ._upstream import BPEStreamingDetokenizer, StreamingDetokenizer, byte_decoder

_SPACE = 32
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPM_SPACE = "\u2581"
_JOIN_AFTER = 256
"""Segments kept as pieces before they are joined into one string (see the module's doc)."""


class TokenTexts:
    """What one tokenizer's ids stand for, built once per model (at load, on the engine
    thread: it reads the whole vocabulary) and shared by its requests' detokenizers and
    logprobs. `tokenizer` is mlx-lm's wrapper."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        detokenizer = tokenizer.detokenizer
        bpe = isinstance(detokenizer, BPEStreamingDetokenizer) and byte_decoder is not None
        self.tokenmap: list[str | None] | None = (
            _every_id(tokenizer, detokenizer.tokenmap) if bpe else None
        )
        """Byte-level BPE: each id's token string (None: a hole), up to the tokenizer's last."""
        self._byte_of: dict[str, int] = _byte_table() if bpe else {}
        self._whole: dict[int, str | None] = {}
        """Each token id seen so far -> its text when its bytes are whole UTF-8 on their own
        (None when they are not: held back, or a lone space): `LinearBPEDetokenizer`'s."""
        self._bytes: dict[int, bytes] = {}

    def detokenizer(self, *, trim_space: bool = True) -> StreamingDetokenizer:
        """A fresh streaming detokenizer for one request. `trim_space` drops one space from
        the start of the text, as mlx-lm's detokenizers do; without it the text is the exact
        continuation of the prompt."""
        if self.tokenmap is not None:
            return LinearBPEDetokenizer(self.tokenmap, trim_space=trim_space, known=self._whole)
        detokenizer = self.tokenizer.detokenizer
        if hasattr(detokenizer, "trim_space"):  # mlx-lm's SentencePiece detokenizer
            detokenizer.trim_space = trim_space
        return TextlessSkipped(detokenizer)

    def token_bytes(self, token: int) -> bytes:
        """A token id's exact bytes: what it stands for in the text, a partial UTF-8 sequence
        included (logprobs' `bytes`, from which clients rebuild characters split across
        tokens); empty for an id without text. Kept per id on first use (at most one entry
        per id the model can sample)."""
        known = self._bytes.get(token)
        if known is None:
            known = self._bytes[token] = self._token_bytes(token)
        return known

    def _token_bytes(self, token: int) -> bytes:
        """Byte-level BPE: the token's characters through the GPT-2 byte table, as the
        detokenizer maps them. SentencePiece: `<0xNN>` pieces are that byte, `▁` a space."""
        if self.tokenmap is not None:
            chars = self.tokenmap[token] if 0 <= token < len(self.tokenmap) else None
            data = bytearray()
            for c in chars or "":
                value = self._byte_of.get(c)
                # As the detokenizer's text has it: outside the table (a special token's
                # text), and the table's byte 0 (mlx-lm's quirk), a character keeps its UTF-8.
                if value:
                    data.append(value)
                else:
                    data.extend(c.encode("utf-8"))
            return bytes(data)
        if token < 0:
            return b""
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if piece is None:  # no token has this id
            return b""
        if isinstance(piece, str):
            byte = _BYTE_PIECE.fullmatch(piece)
            if byte:
                return bytes([int(byte.group(1), 16)])
            if _SPM_SPACE in piece:
                return piece.replace(_SPM_SPACE, " ").encode("utf-8")
        return str(self.tokenizer.decode([token])).encode("utf-8", "replace")


def make_detokenizer(tokenizer: Any, *, trim_space: bool = True) -> StreamingDetokenizer:
    """A fresh streaming detokenizer for `tokenizer` (mlx-lm's wrapper) alone: for tests and
    tools; the engine keeps one `TokenTexts` per model instead (this reads the vocabulary)."""
    return TokenTexts(tokenizer).detokenizer(trim_space=trim_space)


def _every_id(tokenizer: Any, tokenmap: list[str | None]) -> list[str | None]:
    """mlx-lm's map of the ids below the tokenizer's length, extended to its last id: with
    holes in the vocabulary, ids past its length have text (`tokenmap` is not changed)."""
    last = max(tokenizer.get_vocab().values(), default=-1)
    if last < len(tokenmap):
        return tokenmap
    more = tokenizer.convert_ids_to_tokens(list(range(len(tokenmap), last + 1)))
    return [*tokenmap, *more]


class TextlessSkipped(StreamingDetokenizer):  # type: ignore[misc]  # untyped base
    """mlx-lm's SentencePiece or naive detokenizer, never given an id past its map (the
    SentencePiece one raises IndexError there; the naive one decodes through the tokenizer,
    which gives an unknown id no text)."""

    def __init__(self, inner: StreamingDetokenizer) -> None:
        self._inner = inner
        tokenmap = getattr(inner, "tokenmap", None)
        self._limit = len(tokenmap) if tokenmap is not None else None
        self.tokens: list[int] = []

    def reset(self) -> None:
        self._inner.reset()
        self.tokens = []

    def add_token(self, token: int) -> None:
        self.tokens.append(token)
        if token >= 0 and (self._limit is None or token < self._limit):
            self._inner.add_token(token)

    def finalize(self) -> None:
        self._inner.finalize()

    @property
    def text(self) -> str:
        return str(self._inner.text)

    @property
    def last_segment(self) -> str:
        return str(self._inner.last_segment)


class LinearBPEDetokenizer(StreamingDetokenizer):  # type: ignore[misc]  # untyped base
    def __init__(
        self,
        tokenmap: list[str | None],
        *,
        trim_space: bool = True,
        known: dict[int, str | None] | None = None,
    ) -> None:
        """`tokenmap`: each id's token string (None: no token has the id); shared, read-only.
        `known`: the whole texts found so far (`TokenTexts`), shared by the detokenizers of
        one tokenizer."""
        self._tokenmap = tokenmap
        self._trim_space = trim_space
        assert byte_decoder is not None, "made only where mlx-lm's byte table is"
        self._byte_of: dict[str, int] = _byte_table()
        self._whole = known if known is not None else {}
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
        v = self._tokenmap[token] if 0 <= token < len(self._tokenmap) else None
        if not v:  # an id without text (a hole, or past the tokenizer): nothing to add
            return
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


@functools.cache
def _byte_table() -> dict[str, int]:
    """mlx-lm's GPT-2 byte table, built once: every request's detokenizer reads it (and
    never writes it)."""
    return byte_decoder() if byte_decoder is not None else {}
