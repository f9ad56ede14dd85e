"""Train a byte-level BPE tokenizer offline, deterministically.

The corpus is generated here from fixed word lists (not read from the machine),
so the same call gives the same tokenizer bytes everywhere. The learned
vocabulary is padded with filler entries up to the architecture's vocab size so
that every id a random model samples decodes to something.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from ._chat_template import CHAT_TEMPLATE

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Tool-call tags are learned as ordinary tokens so they stream as text the parser can see.
EXTRA_TRAINED_MARKUP = ["<tool_call>", "</tool_call>", "<tools>", "</tools>", "<tool_response>"]
THINK_TOKENS = ["<think>", "</think>"]
"""Added tokens of a thinking preset, not special (as Qwen3's): their text is decoded, so the
reasoning's markers reach the text the server splits."""
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "capital",
    "France",
    "Paris",
    "city",
    "country",
    "river",
    "weather",
    "today",
    "function",
    "call",
    "arguments",
    "name",
    "value",
    "query",
    "result",
    "error",
    "message",
    "user",
    "assistant",
    "system",
    "tool",
    "json",
    "list",
    "string",
    "number",
    "true",
    "false",
    "null",
    "hello",
    "world",
    "please",
    "thanks",
    "answer",
    "question",
    "what",
    "where",
    "why",
    "model",
    "token",
    "server",
    "request",
]
_PUNCT = [".", ",", "?", "!", ":", ";", "'", '"', "(", ")", "-"]


def corpus(n_lines: int = 6000) -> list[str]:
    rng = random.Random(20261122)
    lines: list[str] = []
    for i in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 18))]
        if i % 3 == 0:
            words[0] = words[0].capitalize()
        line = " ".join(words) + rng.choice(_PUNCT)
        if i % 7 == 0:
            args = {rng.choice(_WORDS): rng.choice(_WORDS), "n": rng.randint(0, 9999)}
            call = json.dumps({"name": rng.choice(_WORDS), "arguments": args})
            line += f"\n<tool_call>\n{call}\n</tool_call>"
        if i % 11 == 0:
            line = f"<|im_start|>user\n{line}<|im_end|>\n<|im_start|>assistant\n"
        if i % 13 == 0:
            line += f' {rng.randint(0, 10**6)} {rng.random():.4f} {{"key": [1, 2, 3]}}'
        lines.append(line)
    lines.extend(EXTRA_TRAINED_MARKUP * 50)
    return lines


def build_tokenizer(
    trained_vocab: int, vocab_size: int, special_tokens: list[str] = SPECIAL_TOKENS
) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(trained_vocab, vocab_size),
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def write_tokenizer(
    out: Path,
    trained_vocab: int,
    vocab_size: int,
    context_length: int,
    *,
    special_tokens: list[str] = SPECIAL_TOKENS,
    added_tokens: list[str] | None = None,
    chat_template: str = CHAT_TEMPLATE,
) -> dict[str, int]:
    """Write tokenizer.json and tokenizer_config.json; return the added token ids (special
    and `added_tokens`, which are added as text tokens, not special ones, and take the last
    ids of the vocabulary)."""
    tokenizer = build_tokenizer(trained_vocab, vocab_size, special_tokens)
    spec = _padded(tokenizer, vocab_size - len(added_tokens or []))
    if added_tokens:
        spec = _with_added(spec, added_tokens, vocab_size)
    (out / "tokenizer.json").write_text(
        json.dumps(spec, ensure_ascii=False, sort_keys=True), "utf-8"
    )
    ids = {t["content"]: t["id"] for t in spec["added_tokens"]}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True), "utf-8"
    )
    return ids


def _padded(tokenizer: Tokenizer, size: int) -> dict[str, Any]:
    """The trained tokenizer's JSON with filler entries after its learned ids, up to `size`
    ids, so that every id a random model samples decodes to something."""
    spec: dict[str, Any] = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    next_id = max(max(vocab.values()), max(t["id"] for t in spec["added_tokens"])) + 1
    for i in range(next_id, size):
        # Printable ASCII only: it round-trips through the byte-level decoder unchanged.
        vocab[f"<filler_{i}>"] = i
    return spec


def _with_added(spec: dict[str, Any], tokens: list[str], vocab_size: int) -> dict[str, Any]:
    """`spec` (a vocabulary of `vocab_size - len(tokens)` ids) with `tokens` added as text
    tokens at its last ids.

    The tokenizers library numbers added tokens itself, not as the file says: each load puts
    a token its model's vocabulary lacks right after that vocabulary. So the library numbers
    them here, where every later load (transformers, mlx-lm, llguidance) puts them too, and
    no id is left without text."""
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in tokens])
    got = [tokenizer.token_to_id(t) for t in tokens]
    first = vocab_size - len(tokens)
    if got != list(range(first, vocab_size)):
        raise ValueError(f"added tokens {tokens} took ids {got}, not {first}..{vocab_size - 1}")
    added: dict[str, Any] = json.loads(tokenizer.to_str())
    return added
