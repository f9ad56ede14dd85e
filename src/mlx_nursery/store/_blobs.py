"""A stored response's large strings kept once, by content: what makes a row's size its
content's, not a multiple of it.

A request's image (a `data:` URL) and its long texts appear in a stored row twice: in the
input items (for /input_items) and in the conversation (what a follow-up replays); a long
output appears in the response body and in the conversation. Every string of `MIN_BLOB`
characters or more is therefore taken out of the row's three JSON documents into a table
keyed by its digest (a follow-up's row, which carries the same image in its conversation,
references the same entry: on disk, once; and counted once, `_rows.py`), and a marker
stands in its place.

The marker is a string that begins with NUL; in a row that holds markers, any string of the
client's that begins with NUL is escaped by one more NUL, so no client string reads as a
marker. A row without large strings is stored as it is (rows written before blobs existed
are such rows: their strings are never unescaped). A marker is restored only from the
entries the row itself references, so a client naming a digest reads nothing it did not
store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import attrs

MIN_BLOB = 1024
"""Characters from which a string is stored once by content rather than in the row."""

_MARK = "\x00blob:"
_NUL = "\x00"


@attrs.frozen
class EncodedRow:
    """A response's three JSON documents as stored, and the large strings they reference."""

    body: str
    input_items: str
    conversation: str
    blobs: dict[str, str] = attrs.field(factory=dict)
    """digest -> the string as a JSON literal (ASCII: PostgreSQL's text holds no NUL)."""

    @property
    def size(self) -> int:
        """Bytes of the documents alone (json.dumps writes ASCII: characters are bytes)."""
        return len(self.body) + len(self.input_items) + len(self.conversation)


def encode(
    body: dict[str, Any], input_items: list[dict[str, Any]], conversation: list[dict[str, Any]]
) -> EncodedRow:
    """The row to store for these documents (module docstring)."""
    blobs: dict[str, str] = {}
    documents = [_extracted(document, blobs) for document in (body, input_items, conversation)]
    if not blobs:  # nothing taken out: stored as it is, no escaping
        documents = [body, input_items, conversation]
    body_text, items_text, conversation_text = (json.dumps(document) for document in documents)
    return EncodedRow(body_text, items_text, conversation_text, blobs)


def decode(text: str, blobs: Mapping[str, str]) -> Any:
    """A stored document back as it was put; `blobs` (digest -> the string, see `loaded`)
    holds the entries its row references: none, for a row stored as it is."""
    document = json.loads(text)
    return _restored(document, blobs) if blobs else document


def loaded(blobs: Mapping[str, str]) -> dict[str, str]:
    """Stored entries (JSON literals) as strings: each once, however often a row names it."""
    return {digest: json.loads(literal) for digest, literal in blobs.items()}


def _extracted(value: Any, blobs: dict[str, str]) -> Any:
    if isinstance(value, str):
        if len(value) >= MIN_BLOB:
            literal = json.dumps(value)
            digest = hashlib.sha256(literal.encode()).hexdigest()
            blobs[digest] = literal
            return _MARK + digest
        return _NUL + value if value.startswith(_NUL) else value
    if isinstance(value, list):
        return [_extracted(item, blobs) for item in value]
    if isinstance(value, dict):
        return {key: _extracted(item, blobs) for key, item in value.items()}
    return value


def _restored(value: Any, blobs: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        if value.startswith(_MARK):
            return blobs[value[len(_MARK) :]]  # a row's markers name its own entries only
        return value[1:] if value.startswith(_NUL) else value
    if isinstance(value, list):
        return [_restored(item, blobs) for item in value]
    if isinstance(value, dict):
        return {key: _restored(item, blobs) for key, item in value.items()}
    return value
