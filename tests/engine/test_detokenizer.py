"""The linear BPE detokenizer gives mlx-lm's segments exactly, and does not slow down on a
run of tokens that keeps ending in an incomplete UTF-8 sequence. Ids past the vocabulary are
the one difference: mlx-lm writes "!" for them, the engine nothing (`mlx_lm_reference`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, load

from mlx_nursery.engine._detokenizer import (
    LinearBPEDetokenizer,
    TextlessSkipped,
    make_detokenizer,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return load(tiny_model)


def segments(detokenizer: Any, tokens: list[int]) -> list[str]:
    """What the engine emits: one segment per token, then what finalize releases; and the
    whole text, halfway and at the end."""
    out = []
    for i, token in enumerate(tokens):
        detokenizer.add_token(token)
        out.append(detokenizer.last_segment)
        if i == len(tokens) // 2:
            out.append(detokenizer.text)
    detokenizer.finalize()
    out.append(detokenizer.last_segment)
    out.append(detokenizer.text)
    return out


def mlx_lm_reference(tokenizer: Any) -> Any:
    """mlx-lm's detokenizer, never given an id past its map (it writes "!" for one; an id
    without text stands for nothing here)."""
    return TextlessSkipped(tokenizer.detokenizer)


def partial_byte_tokens(tokenizer: Any) -> list[int]:
    """Tokens whose string is one byte-level character of a UTF-8 lead byte."""
    byte_of = _byte_table()
    return [
        i
        for i, t in enumerate(tokenizer.detokenizer.tokenmap)
        if len(t) == 1 and byte_of.get(t, 0) >= 0xC2
    ]


def _byte_table() -> dict[str, int]:
    from mlx_lm.tokenizer_utils import _byte_decoder

    return _byte_decoder()


def test_the_engine_gets_the_linear_detokenizer_for_a_bpe_tokenizer(tokenizer: Any) -> None:
    assert isinstance(tokenizer.detokenizer, BPEStreamingDetokenizer)
    assert isinstance(make_detokenizer(tokenizer), LinearBPEDetokenizer)


def test_same_segments_as_mlx_lm_on_text_and_on_random_tokens(tokenizer: Any) -> None:
    vocab = len(tokenizer.detokenizer.tokenmap)
    rng = random.Random(7)
    partial = partial_byte_tokens(tokenizer)
    assert partial, "the factory's byte-level vocab has lead-byte tokens"
    runs = [
        tokenizer.encode(" Hello, wörld! 你好 — naïve café ☕ \n  spaced  out"),
        [rng.randrange(vocab + 20) for _ in range(300)],  # ids past the vocab included
        tokenizer.encode(" ".join(["word"] * 600)),  # more segments than are kept apart
        [partial[0]] * 200,  # a degenerate run: every token ends incomplete
        [rng.choice(partial) for _ in range(100)] + tokenizer.encode(" and then text"),
    ]
    tokenmap = tokenizer.detokenizer.tokenmap
    space = tokenmap.index("Ġ")
    runs.append([space, *tokenizer.encode("after a lone space"), space])
    byte_zero = tokenmap.index("Ā")  # the byte table's 0, which mlx-lm's add_token maps as UTF-8
    runs += [
        [byte_zero, *tokenizer.encode(" ok")],
        [partial[0], byte_zero],
        [partial[0], byte_zero, partial[0]],
    ]
    for _ in range(20):
        runs.append([rng.choice([*partial, rng.randrange(vocab)]) for _ in range(60)])
    for tokens in runs:
        assert segments(make_detokenizer(tokenizer), tokens) == segments(
            mlx_lm_reference(tokenizer), tokens
        )


def test_a_degenerate_run_costs_each_token_its_own_bytes(tokenizer: Any) -> None:
    """Counted, not timed: the bytes decoded per token stay flat while the run grows."""
    detokenizer = make_detokenizer(tokenizer)
    assert isinstance(detokenizer, LinearBPEDetokenizer)
    decoded: list[int] = []
    original = detokenizer._decoder.decode

    def counting(data: bytes, final: bool = False) -> str:
        decoded.append(len(data))
        return original(data, final)

    detokenizer._decoder.decode = counting  # type: ignore[method-assign]
    lead_byte = partial_byte_tokens(tokenizer)[0]
    for _ in range(2000):
        detokenizer.add_token(lead_byte)
    assert detokenizer.text == ""  # still held back, as mlx-lm holds it
    assert max(decoded) == 1
