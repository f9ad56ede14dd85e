"""The built-in scripted model: a tokenizer and a config, no weights.

`--model scripted` serves it. Each request says what it answers and when (its `script`,
generation/_scripts.py); the engine runs it through the same lanes, queue, deadlines and
cancellation as any model, with `engine/_scripted.py`'s stepper in place of MLX compute.
So a test harness measures the real server's behaviour against a model it controls.

The directory is the `tiny` preset's tokenizer (a byte-level BPE trained locally, with the
ChatML template that renders tools) and a config whose `model_type` marks the kind. It is
written once into the user cache directory, as the default model is.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..tools import EOS_TOKEN, PAD_TOKEN, PRESETS, write_tokenizer
from .default import cache_dir

SCRIPTED_MODEL = "scripted"
"""What `--model` names it by (a directory of that name, if one exists, is served instead)."""
SCRIPTED_KIND = "scripted"
"""Its config's `mlx_nursery_kind` (no `model_type`: transformers would warn of an unknown one)."""
CONTEXT_LENGTH = 32768
_VERSION = 1
"""Bumped whenever what is written changes, so that an old cached copy is not used."""


def scripted_model_dir() -> Path:
    return cache_dir() / "models" / f"scripted-v{_VERSION}"


def ensure_scripted_model() -> Path:
    """The scripted model's directory, written on first use (a second or so: the tokenizer
    is trained). Safe against concurrent writers: each writes a temporary directory and
    renames it into place; a loser's copy is dropped. File work: call it off the Trio
    thread."""
    out = scripted_model_dir()
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".scripted-") as tmp:
        staging = Path(tmp) / "model"
        staging.mkdir()
        preset = PRESETS["tiny"]
        ids = write_tokenizer(staging, preset.trained_vocab, preset.vocab_size, CONTEXT_LENGTH)
        config = {
            "mlx_nursery_kind": SCRIPTED_KIND,
            "max_position_embeddings": CONTEXT_LENGTH,
            "vocab_size": preset.vocab_size,
            "eos_token_id": [ids[EOS_TOKEN], ids[PAD_TOKEN]],
            "pad_token_id": ids[PAD_TOKEN],
        }
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
        try:
            os.replace(staging, out)
        except OSError:  # another process put its copy there first: theirs is as good
            if not (out / "config.json").is_file():
                raise
    return out
