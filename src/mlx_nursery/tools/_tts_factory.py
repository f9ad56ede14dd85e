"""A KittenTTS or Kokoro directory that mlx-audio loads (`mlx_audio.tts.load(path,
strict=True)`), random weights, offline, deterministic for a seed.

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

Kokoro (`tiny-kokoro`) is the model issue 36 named first; it is here so that its real code
runs in tests (`models/_kokoro.py`) with its letters as phonemes, as KittenTTS's do. Its
vocabulary is KittenTTS's symbol table (letters, punctuation, IPA). mlx-audio initializes its
weight-normed convolutions' directions to ones: every channel the same, so activations grow
~20x a block until the audio is NaN; they are drawn at random here. Its voices follow
Kokoro's names (language, gender, name: `af_alloy`); `ef_dora` is a Spanish voice, which the
server does not list (only English voices are served).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ._presets import Preset

VOICES = ("alloy", "echo", "fable", "nova")
KOKORO_VOICES = ("af_alloy", "am_echo", "bf_fable", "bm_nova", "ef_dora")
_KOKORO_PACK_ROWS = 510
"""Rows per Kokoro voice: a style per phoneme count (mlx-audio indexes by length - 1)."""
_STYLE_ROWS = 8
"""Rows per voice: KittenTTS picks a style row by the input's length."""
_VOCODER_SCALE = 1e-6


def write_tts(out: Path, spec: Preset, dtype: str, seed: int) -> None:
    """Write `spec`'s text-to-speech model (its config's `model_type`) into `out`."""
    if spec.config["model_type"] == "kokoro":
        write_kokoro(out, spec, dtype, seed)
    else:
        write_kitten(out, spec, dtype, seed)


def write_kokoro(out: Path, spec: Preset, dtype: str, seed: int) -> None:
    """Write `spec`'s Kokoro into `out`: config, weights, `voices/*.safetensors`. Uses MLX's
    global random state, seeded here."""
    from mlx_audio.tts.models.kitten_tts.kitten_tts import TextCleaner
    from mlx_audio.tts.models.kokoro.kokoro import Model, ModelConfig

    symbols = TextCleaner().word_index_dictionary
    config: dict[str, Any] = dict(spec.config)
    config.update(
        vocab={s: i for s, i in symbols.items() if i > 0},  # 0 is Kokoro's boundary id
        mlx_nursery_preset=spec.name,
        mlx_nursery_g2p="graphemes",
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    mx.random.seed(seed)
    model = Model(ModelConfig.from_dict(config))
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    directions = [(k, mx.random.uniform(-1, 1, v.shape)) for k, v in flat if k.endswith("weight_v")]
    model.update(tree_unflatten(directions))
    _save_weights(out, model, dtype, model.sanitize)
    rng = np.random.default_rng(seed)
    (out / "voices").mkdir(exist_ok=True)
    for voice in KOKORO_VOICES:
        pack = rng.standard_normal((_KOKORO_PACK_ROWS, 1, 256)).astype(np.float32)
        mx.save_safetensors(str(out / "voices" / f"{voice}.safetensors"), {"voice": mx.array(pack)})


def _save_weights(out: Path, model: Any, dtype: str, sanitize: Any = None) -> None:
    """Save `model`'s parameters as its loader expects them: where `sanitize` (the model's
    loader hook) would transpose a convolution's weight (Kokoro guesses PyTorch's layout
    from its shape), the weight is saved transposed, so that the load gives it back."""
    model.set_dtype(getattr(mx, dtype))
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = dict(sorted(flat, key=lambda kv: kv[0]))
    for name, value in weights.items():
        if sanitize is not None and value.ndim == 3:
            kept = sanitize({name: value}).get(name)
            if kept is None or kept.shape != value.shape or not mx.array_equal(kept, value):
                weights[name] = value.transpose(0, 2, 1)
    mx.eval(list(weights.values()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


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
    _save_weights(out, model, dtype)
    rng = np.random.default_rng(seed)
    styles = {v: rng.standard_normal((_STYLE_ROWS, 256)).astype(np.float32) for v in VOICES}
    with (out / "voices.npz").open("wb") as file:
        np.savez(file, **styles)  # type: ignore[arg-type]
