"""`truncate_prompt_tokens` cuts texts and pairs exactly as Hugging Face's tokenizer call with
`truncation=True, max_length=k` does (what vLLM asks for), without touching the tokenizer
that every preparation thread shares."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mlx_nursery.generation import InvalidRequest
from mlx_nursery.models import Classifier
from mlx_nursery.openai import ServedEmbedder
from mlx_nursery.openai._scoring_inputs import encode_pairs, encode_texts, truncation_limit

TEXTS = [
    "a",
    "what is it",
    "the the of and to in is you that it he was for on are as with his they at",
    "one two three four five six seven",
]


def served(model: Path, context: int = 128) -> ServedEmbedder:
    return ServedEmbedder(
        name="rr",
        aliases=frozenset(),
        created=0,
        tokenizer=AutoTokenizer.from_pretrained(str(model)),
        context_length=context,
        vocab_size=1024,
        dimensions=1,
        matryoshka=None,
        classifier=Classifier("sigmoid", token_types=True),
    )


def test_pairs_and_texts_are_cut_as_the_tokenizers_own_truncation_cuts_them(
    tiny_reranker: Path,
) -> None:
    model = served(tiny_reranker)
    reference = AutoTokenizer.from_pretrained(str(tiny_reranker))  # its own object: it is set
    shared = model.tokenizer.backend_tokenizer
    for k in (4, 5, 6, 7, 9, 12, 17, 24, 33, 40):
        for query in TEXTS:
            got = encode_pairs(
                model, [(query, "q")], [(d, f"d{i}") for i, d in enumerate(TEXTS)], k
            )
            for ids, types, document in zip(got.ids, got.types or [], TEXTS, strict=True):
                want = reference(
                    query, document, truncation=True, max_length=k, return_token_type_ids=True
                )
                assert (ids, types) == (want["input_ids"], want["token_type_ids"]), (k, query)
        alone = encode_texts(model, [(t, "t") for t in TEXTS], k - 1)
        assert alone.ids == [
            reference(t, truncation=True, max_length=k - 1)["input_ids"] for t in TEXTS
        ]
    assert shared.truncation is None  # the shared tokenizer was never set to cut


def test_limits_and_lengths_are_400s_naming_the_input(tiny_reranker: Path) -> None:
    model = served(tiny_reranker, context=16)
    assert truncation_limit(None, model, pair=True) is None
    assert truncation_limit(-1, model, pair=True) == 16
    for bad in (0, 3, 17, -2):  # a pair's 3 special tokens need one token beside them
        with pytest.raises(InvalidRequest, match="truncate_prompt_tokens") as refused:
            truncation_limit(bad, model, pair=True)
        assert refused.value.param == "truncate_prompt_tokens"
    assert truncation_limit(3, model, pair=False) == 3
    long = " ".join(["the"] * 20)
    with pytest.raises(InvalidRequest, match="16 tokens") as too_long:
        encode_pairs(model, [("a", "query")], [("b", "documents[0]"), (long, "documents[1]")], None)
    assert too_long.value.param == "documents[1]"
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(InvalidRequest, match="empty") as empty:
        encode_texts(model, [("a", "text_1"), ("", "text_2[0]")], None)
    assert empty.value.param == "text_2[0]"
