"""Prompt tokenizing per request: the chat template's own tokenizing against the server's
piecewise encoder (`openai/_tokenizing.py`), on conversations that share a long prefix.

Agent traffic resends the whole conversation every turn; the server prepares requests on
one thread, so what tokenizing costs a request delays every request behind it. Each
conversation is rendered and tokenized both ways (the ids are checked equal); the first is
the cold case (nothing cached), the rest share its long pieces.

Usage:
  python -P bench/tokenizing.py --tokenizer MODEL_DIR --dataset conversations.jsonl
  python -P bench/tokenizing.py --shared-words 6000 --conversations 20   # made up, tiny model
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlx_nursery.generation import SegmentEncoder
from mlx_nursery.tools import make_model

WORDS = ("the", "quick", "brown", "fox", "reads", "every", "page", "of", "the", "manual")


def conversations(args: argparse.Namespace) -> list[list[dict[str, Any]]]:
    if args.dataset:
        lines = Path(args.dataset).read_text("utf-8").splitlines()
        return [json.loads(line)["messages"] for line in lines[: args.conversations]]
    system = " ".join(WORDS[i % len(WORDS)] for i in range(args.shared_words))
    return [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {i}: what does page {i} say?"},
        ]
        for i in range(args.conversations)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", help="model directory (default: the tiny preset)")
    parser.add_argument("--dataset", help="JSONL of {'messages': [...]} (bench/serving.py's)")
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--shared-words", type=int, default=6000)
    args = parser.parse_args()
    directory = args.tokenizer or make_model(Path(tempfile.mkdtemp()) / "tiny", "tiny")
    tokenizer = load_tokenizer(Path(directory))
    encoder = SegmentEncoder(tokenizer)
    whole_ms: list[float] = []
    pieces_ms: list[float] = []
    tokens = 0
    for messages in conversations(args):
        template = {"add_generation_prompt": True}
        started = time.perf_counter()
        whole = list(tokenizer.apply_chat_template(messages, tokenize=True, **template))
        middle = time.perf_counter()
        text = tokenizer.apply_chat_template(messages, tokenize=False, **template)
        pieces = encoder.encode(text)
        ended = time.perf_counter()
        assert pieces == whole, "the piecewise encoder gave other ids"
        whole_ms.append((middle - started) * 1000)
        pieces_ms.append((ended - middle) * 1000)
        tokens = max(tokens, len(whole))
    print(
        json.dumps(
            {
                "tokenizer": str(directory),
                "encoder_enabled": encoder.enabled,
                "conversations": len(whole_ms),
                "prompt_tokens_max": tokens,
                "template_ms_median": statistics.median(whole_ms),
                "pieces_ms_first": pieces_ms[0],
                "pieces_ms_median_after_first": statistics.median(pieces_ms[1:] or pieces_ms),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
