"""Tokens whose text the linear detokenizer already knows (their bytes are whole UTF-8) take
its shortcut; the segments stay mlx-lm's, for a detokenizer that sees them first and for the
next one, which finds them known."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.tokenizer_utils import load

from mlx_nursery.engine._detokenizer import TokenTexts
from tests.engine.test_detokenizer import mlx_lm_reference, partial_byte_tokens, segments


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return load(tiny_model)


def test_known_tokens_give_mlx_lm_segments_before_and_after_they_are_known(
    tokenizer: Any,
) -> None:
    tokenmap = tokenizer.detokenizer.tokenmap
    texts = TokenTexts(tokenizer)
    known = texts._whole
    rng = random.Random(11)
    partial = partial_byte_tokens(tokenizer)
    space = tokenmap.index("Ġ")
    text = tokenizer.encode(" The keeper's lamp — ☕ naïve, then 你好 and a  gap")
    runs = [
        text,
        [space, *text, space, space],
        [rng.randrange(len(tokenmap) + 20) for _ in range(400)],
        [rng.choice([*partial, *text]) for _ in range(200)],
    ]
    for _ in range(2):  # the second pass finds every token known
        for tokens in runs:
            assert segments(texts.detokenizer(), tokens) == segments(
                mlx_lm_reference(tokenizer), tokens
            )
    assert known[text[1]] is not None  # an ordinary word is known by its text
    assert known[space] is None  # a lone space is held for the next token
    assert all(known.get(token) is None for token in partial)  # a lead byte is held
