"""Prompts tokenized a piece at a time (`openai/_tokenizing.py`): the same ids as the
tokenizer gives the whole text, long pieces kept, and off for tokenizers it does not fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mlx_nursery.generation import SegmentEncoder, _tokenizing


@pytest.fixture(scope="module", params=["tiny_model", "tiny_vlm"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    """The factory's tokenizers: the text one, and the VLM's with the vision tokens."""
    return load_tokenizer(Path(request.getfixturevalue(request.param)))


def pieces(tokenizer: Any) -> st.SearchStrategy[str]:
    specials = [t.content for t in tokenizer._tokenizer.added_tokens_decoder.values()]
    text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
    return st.lists(st.one_of(text, st.sampled_from(specials), st.sampled_from([" ", "\n"])))


def test_pieces_give_the_tokenizers_own_ids(tokenizer: Any) -> None:
    encoder = SegmentEncoder(tokenizer)
    assert encoder.enabled

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(pieces(tokenizer))
    def check(parts: list[str]) -> None:
        text = "".join(parts)
        assert encoder.encode(text) == list(tokenizer.encode(text, add_special_tokens=False))

    check()


def test_a_long_piece_seen_before_is_not_tokenized_again(tokenizer: Any) -> None:
    encoder = SegmentEncoder(tokenizer)
    system = "You are a careful assistant who reads the whole manual. " * 40
    turn = "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    first = encoder.encode(turn.format(system, "first question"))
    assert encoder.hits == 0
    second = encoder.encode(turn.format(system, "second question"))
    assert encoder.hits == 1
    assert second == list(
        tokenizer.encode(turn.format(system, "second question"), add_special_tokens=False)
    )
    assert first[: len(first) // 2] == second[: len(first) // 2]


def test_the_kept_pieces_stay_within_their_byte_bound(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream of unique long prompts (a soak's) fills the cache to its bound and no further,
    evicting the least recently used piece first."""
    monkeypatch.setattr(_tokenizing, "MAX_CACHED_BYTES", 20_000)
    encoder = SegmentEncoder(tokenizer)
    turn = "<|im_start|>user\n{}<|im_end|>\n"
    texts = [f"Question {i}: " + "tell me about the harbor and its lamps. " * 10 for i in range(60)]
    for text in texts:
        encoder.encode(turn.format(text))
        assert 0 < encoder.cached_bytes <= 20_000
    hits = encoder.hits
    encoder.encode(turn.format(texts[-1]))
    assert encoder.hits == hits + 1, "the newest piece is kept"
    assert encoder.encode(turn.format(texts[0])) == list(
        tokenizer.encode(turn.format(texts[0]), add_special_tokens=False)
    )
    assert encoder.hits == hits + 1, "the oldest piece was evicted"


def _wrapped(tokenizer: Tokenizer, added: AddedToken) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    fast.add_special_tokens({"additional_special_tokens": [added]})
    return fast


def _word_level() -> Tokenizer:
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "▁a": 3, "▁b": 4, "a▁b": 5}
    return Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))


def test_an_added_token_that_eats_whitespace_turns_it_off() -> None:
    tokenizer = _word_level()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = _wrapped(tokenizer, AddedToken("<sep>", rstrip=True, lstrip=True, special=True))
    encoder = SegmentEncoder(fast)
    assert not encoder.enabled
    assert encoder.encode("a <sep> b") == fast.encode("a <sep> b", add_special_tokens=False)


def test_a_pre_tokenizer_that_marks_only_the_first_piece_turns_it_off() -> None:
    tokenizer = _word_level()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    fast = _wrapped(tokenizer, AddedToken("<sep>", special=True, normalized=False))
    encoder = SegmentEncoder(fast)
    assert encoder._split is not None  # its added token is plain: the sample check decided
    assert not encoder.enabled
    assert encoder.encode("a<sep>b") == fast.encode("a<sep>b", add_special_tokens=False)
