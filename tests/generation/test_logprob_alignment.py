"""LogprobAligner with the real streaming detokenizer: the entries' bytes are the tokens' own
and decode to the content, whether the text keeps its leading space (completions) or drops
it (chat), and when characters are split across tokens."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import _byte_decoder

from mlx_nursery.engine import TokenLogprob
from mlx_nursery.engine._detokenizer import LinearBPEDetokenizer
from mlx_nursery.generation._logprobs import LogprobAligner

TO_CHAR = {value: char for char, value in _byte_decoder().items()}


def run(pieces: list[bytes], *, trim: bool) -> tuple[str, bytes]:
    """Detokenize and align tokens standing for `pieces`; the content and the joined bytes."""
    tokenmap = ["".join(TO_CHAR[b] for b in piece) for piece in pieces]
    detokenizer = LinearBPEDetokenizer(tokenmap, trim_space=trim)
    aligner = LogprobAligner(lambda t: tokenmap[t], lambda t: pieces[t], trimmed_space=trim)
    content, entries = "", []
    for token in range(len(pieces)):
        detokenizer.add_token(token)
        if token == len(pieces) - 1:
            detokenizer.finalize()
        segment = detokenizer.last_segment
        aligner.add(segment, TokenLogprob(token, -0.5))
        content += segment
        entries += aligner.take(segment)
    entries += aligner.finish()
    assert "".join(e.token for e in entries) == content
    return content, b"".join(e.bytes for e in entries)


@pytest.mark.parametrize(
    "pieces",
    [
        [b" \xe4", b"\xbd\xa0", b"\xe5\xa5\xbd"],  # a space and a character split across tokens
        [b" ", b" world"],  # a lone space token, held back, then a spaced word
        [b"\xe4", b"\xbd\xa0", b" x"],  # a split character first, then a spaced word
        [b" Hello", b",", b" world"],
        [b"\xd0", b" 24"],  # an invalid sequence (U+FFFD) before a spaced word: nothing trimmed
    ],
)
@pytest.mark.parametrize("trim", [False, True], ids=["completion", "chat"])
def test_entry_bytes_decode_to_the_content(pieces: list[bytes], trim: bool) -> None:
    content, data = run(pieces, trim=trim)
    assert data.decode("utf-8", "replace") == content
    whole = b"".join(pieces).decode("utf-8", "replace")
    assert content == whole[1 if trim and pieces[0].startswith(b" ") else 0 :]


@pytest.mark.parametrize("trim", [False, True], ids=["completion", "chat"])
def test_each_entry_is_its_own_token_when_the_detokenizer_holds_a_space_back(trim: bool) -> None:
    """A lone space token's text comes out with the next token's segment; its entry is still
    " " and the next one "1" (OpenAI's tokens are the tokens' own text), so that a legacy
    client's `top_logprobs[i][tokens[i]]` finds the sampled token."""
    pieces = [b"Count", b":", b" ", b"1", b",", b" ", b"2"]
    tokenmap = ["".join(TO_CHAR[b] for b in piece) for piece in pieces]
    detokenizer = LinearBPEDetokenizer(tokenmap, trim_space=trim)
    aligner = LogprobAligner(lambda t: tokenmap[t], lambda t: pieces[t], trimmed_space=trim)
    entries = []
    for token in range(len(pieces)):
        detokenizer.add_token(token)
        segment = detokenizer.last_segment
        aligner.add(segment, TokenLogprob(token, -0.5))
        entries += aligner.take(segment)
    detokenizer.finalize()
    entries += aligner.take(detokenizer.last_segment) + aligner.finish()
    assert [e.token for e in entries] == ["Count", ":", " ", "1", ",", " ", "2"]
    assert [e.bytes for e in entries] == pieces


def test_a_stop_cut_after_a_held_space_shows_each_character_once() -> None:
    """Content cut by a stop string right after a space that was released with the next token:
    the space's own entry showed it, so the straddling token shows nothing more."""
    pieces = [b"a", b" ", b"1"]
    tokenmap = ["".join(TO_CHAR[b] for b in piece) for piece in pieces]
    detokenizer = LinearBPEDetokenizer(tokenmap, trim_space=False)
    aligner = LogprobAligner(lambda t: tokenmap[t], lambda t: pieces[t])
    segments = []
    for token in range(len(pieces)):
        detokenizer.add_token(token)
        segments.append(detokenizer.last_segment)
        aligner.add(segments[-1], TokenLogprob(token, -0.5))
    assert segments == ["a", "", " 1"]
    entries = aligner.take("a ")  # a stop string "1" cut the content after the space
    entries += aligner.finish()
    assert "".join(e.token for e in entries) == "a "
    assert [e.token for e in entries] == ["a", " ", ""]
