"""A KittenTTS directory that mlx-audio loads (`mlx_audio.tts.load(path, strict=True)`),
random weights, offline, deterministic for a seed.

Why KittenTTS: it is mlx-audio's smallest text-to-speech architecture (an ALBERT, a duration
and pitch predictor, an iSTFTNet vocoder), it takes symbol ids that include the plain
letters, and its voices are style vectors in one `voices.npz`. Every real mlx-audio TTS
model needs a grapheme-to-phoneme front end (KittenTTS: espeak through phonemizer; Kokoro:
misaki, with espeak for unknown words), none of which this machine has or could fetch
offline; a tiny model marked `"mlx_nursery_g2p": "graphemes"` feeds its letters as symbols
instead (`models/_synthesis.py`), which a random model does not mind.

The vocoder's last convolution is scaled down: random weights grow activations layer by
layer until the vocoder's `exp` overflows (NaN audio); scaled, the clip is quiet and finite.
Voices are named after OpenAI's, so clients that send `alloy` work unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ._presets import Preset

VOICES = ("alloy", "echo", "fable", "nova")
_STYLE_ROWS = 8
"""Rows per voice: KittenTTS picks a style row by the input's length."""
_VOCODER_SCALE = 1e-6


def write_kitten(out: Path, spec: Preset, dtype: str, seed: int) -> None:
    """Write `spec`'s KittenTTS into `out`: config, weights, voices. Uses MLX's global random
    state, seeded here."""
    from mlx_audio.tts.models.kitten_tts.kitten_tts import Model, ModelConfig

    config: dict[str, Any] = dict(spec.config)
    config.update(
        voices_path="voices.npz", mlx_nursery_preset=spec.name, mlx_nursery_g2p="graphemes"
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    mx.random.seed(seed)
    model = Model(ModelConfig.from_dict(config))
    post = model.decoder.generator.conv_post
    post.update({"weight_g": post.weight_g * _VOCODER_SCALE})
    model.set_dtype(getattr(mx, dtype))
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = dict(sorted(flat, key=lambda kv: kv[0]))
    mx.eval(list(weights.values()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    rng = np.random.default_rng(seed)
    styles = {v: rng.standard_normal((_STYLE_ROWS, 256)).astype(np.float32) for v in VOICES}
    with (out / "voices.npz").open("wb") as file:
        np.savez(file, **styles)  # type: ignore[arg-type]
