"""A rerank or score request's texts as the engine's token ids: pairs framed together for a
cross-encoder, texts alone for an embedding model; within the model's length, or cut to
`truncate_prompt_tokens`.

Cutting is Hugging Face's (`truncation=True, max_length=k`, which vLLM asks for): a text
loses tokens from its end before the special tokens go around it, and a pair loses them from
its longer text first (`_longest_first`, the `tokenizers` library's "longest_first" rule).
It is done here, on the tokenizer's backend, rather than by passing those arguments: they
set the truncation of the one tokenizer object that every preparation thread shares, so a
request that asks for it would cut, or race with, another's encoding.

Without `truncate_prompt_tokens`, an input longer than the model's length is a 400 naming it,
as on /v1/embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..generation import InvalidRequest, check_prompt_size
from ._embeddings_endpoint import ServedEmbedder

Text = tuple[str, str]
"""A text and where the request holds it (`documents[3]`), for the error that names it."""


@attrs.frozen
class Encoded:
    ids: list[list[int]]
    types: list[list[int]] | None
    """Each input's token types (a cross-encoder's that reads them); None: all 0."""


def _backend(served: ServedEmbedder) -> Any:
    backend = getattr(served.tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise InvalidRequest(
            f"The model {served.name!r} has no fast tokenizer (tokenizer.json): scoring reads "
            "its texts with one.",
            param="model",
            code="model_not_supported",
        )
    return backend


def truncation_limit(asked: int | None, served: ServedEmbedder, *, pair: bool) -> int | None:
    """The tokens an input is cut to (None: none, too long is refused). -1 is the model's
    length; any other value must leave room for a token beside the special ones."""
    if asked is None:
        return None
    context = served.context_length
    if asked == -1:
        return context
    least = _backend(served).num_special_tokens_to_add(pair) + 1
    if not least <= asked <= context:
        raise InvalidRequest(
            f"Invalid 'truncate_prompt_tokens': {asked}; expected -1 (the model's length) or "
            f"from {least} to the model's length, {context}.",
            param="truncate_prompt_tokens",
            code="invalid_value",
        )
    return asked


def _check_not_empty(texts: Sequence[Text]) -> None:
    for text, where in texts:
        if not text:
            raise InvalidRequest(
                f"'{where}' cannot be an empty string.", param=where, code="invalid_value"
            )


def _too_long(served: ServedEmbedder, tokens: int, what: str, where: str) -> InvalidRequest:
    return InvalidRequest(
        f"This model's maximum context length is {served.context_length} tokens, however "
        f"{what} hold {tokens} tokens. Please reduce the length, or set "
        "'truncate_prompt_tokens' to cut it.",
        param=where,
        code="context_length_exceeded",
    )


def encode_texts(served: ServedEmbedder, texts: list[Text], limit: int | None) -> Encoded:
    """Each text alone, with the model's special tokens (an embedding model's inputs)."""
    backend = _backend(served)
    _check_not_empty(texts)
    plain = [text for text, _ in texts]
    if limit is None:
        for text, where in texts:  # text that could not fit is refused before it is tokenized
            check_prompt_size(served, [text], where)  # type: ignore[arg-type]
        encodings = backend.encode_batch(plain, add_special_tokens=True)
        for encoding, (_, where) in zip(encodings, texts, strict=True):
            if len(encoding.ids) > served.context_length:
                raise _too_long(served, len(encoding.ids), f"'{where}' would", where)
        return Encoded([list(e.ids) for e in encodings], None)
    room = limit - backend.num_special_tokens_to_add(False)
    ids: list[list[int]] = []
    for encoding in backend.encode_batch(plain, add_special_tokens=False):
        encoding.truncate(room)
        ids.append(list(backend.post_process(encoding, None, True).ids))
    return Encoded(ids, None)


def encode_pairs(
    served: ServedEmbedder, queries: list[Text], documents: list[Text], limit: int | None
) -> Encoded:
    """Each (query, document) pair framed as one input (a cross-encoder's): one query for
    every document, or one each. Token types kept where the model reads them."""
    backend = _backend(served)
    _check_not_empty([*queries, *documents])
    if limit is None:
        for index, (text, where) in enumerate(documents):
            check_prompt_size(served, [_query(queries, index)[0], text], where)  # type: ignore[arg-type]
    first = backend.encode_batch([text for text, _ in queries], add_special_tokens=False)
    second = backend.encode_batch([text for text, _ in documents], add_special_tokens=False)
    room = (limit or served.context_length) - backend.num_special_tokens_to_add(True)
    ids: list[list[int]] = []
    types: list[list[int]] = []
    for index, document in enumerate(second):
        query = first[0 if len(first) == 1 else index]
        n1, n2 = _longest_first(len(query.ids), len(document.ids), room)
        if (n1, n2) != (len(query.ids), len(document.ids)):
            where = documents[index][1]
            text, where_query = _query(queries, index)
            if limit is None:
                tokens = len(query.ids) + len(document.ids) + served.context_length - room
                raise _too_long(served, tokens, f"'{where_query}' and '{where}' would", where)
            query = backend.encode(text, add_special_tokens=False)  # a copy to cut
            query.truncate(n1)
            document.truncate(n2)
        pair = backend.post_process(query, document, True)
        ids.append(list(pair.ids))
        types.append(list(pair.type_ids))
    reads_types = served.classifier is not None and served.classifier.token_types
    return Encoded(ids, types if reads_types else None)


def _query(queries: list[Text], index: int) -> Text:
    return queries[0 if len(queries) == 1 else index]


def _longest_first(n1: int, n2: int, room: int) -> tuple[int, int]:
    """How many tokens of a pair's two texts (`n1`, `n2`) to keep within `room`: the
    `tokenizers` library's longest_first. The shorter keeps all it has while the longer
    fits beside it; otherwise they split the room, the longer taking the odd token."""
    if n1 + n2 <= room:
        return n1, n2
    swap = n1 > n2
    short, _ = (n2, n1) if swap else (n1, n2)
    long = short if short > room else max(short, room - short)
    if short + long > room:
        short = room // 2
        long = short + room % 2
    return (long, short) if swap else (short, long)
