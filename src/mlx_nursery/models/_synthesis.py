"""Text-to-speech models: mlx-audio's KittenTTS and Kokoro directories.

A directory is a TTS model when its config says `"model_type": "kitten_tts"` or `"kokoro"`.
Both need a grapheme-to-phoneme front end, which is the part that may be missing offline:
KittenTTS phonemizes with espeak (the `phonemizer` package and the espeak-ng library),
Kokoro with misaki (English, with spaCy's `en_core_web_sm`; `_kokoro.py` says why Kokoro
does not go through mlx-audio's `generate`). The load checks for it and says what to
install, instead of failing (or downloading) at the first request. A model written by the
factory (`"mlx_nursery_g2p": "graphemes"`, `tools/_tts_factory.py`) needs none: its letters
are its symbols. Voices: KittenTTS's are the names in its `voices.npz` (and its aliases),
Kokoro's the English ones among the files under `voices/`.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ._kokoro import KokoroSpeaker, check_kokoro, kokoro_voices

TTS_MODEL_TYPES = ("kitten_tts", "kokoro")


@attrs.frozen
class SynthesizedPiece:
    """One piece of audio the model yielded (mono float32 at the model's rate)."""

    samples: npt.NDArray[np.float32]
    tokens: int
    """The symbols (phonemes, or letters) it was made from."""


@attrs.frozen
class SynthesisModel:
    """A loaded TTS model; to be used only from the thread that loaded it."""

    path: Path
    model: Any
    """mlx-audio's model (no type hints there: unchecked)."""
    model_type: str
    sample_rate: int
    voices: tuple[str, ...]
    kokoro: KokoroSpeaker | None = None
    """Kokoro's own path (None: the model's `generate`, KittenTTS's)."""

    def synthesize(
        self, text: str, voice: str, speed: float
    ) -> Generator[SynthesizedPiece, None, None]:
        """The model's own generator for `text`: a piece per segment it makes. Makes MLX
        calls: iterate it on the thread that loaded the model. Closing it early stops it
        between segments (it is a generator: nothing runs between `next` calls)."""
        if self.kokoro is not None:
            for audio, phonemes in self.kokoro.pieces(text, voice, speed):
                yield SynthesizedPiece(audio.astype(np.float32).reshape(-1), phonemes)
            return
        for result in self.model.generate(text=text, voice=voice, speed=speed):
            samples = np.asarray(result.audio, dtype=np.float32).reshape(-1)
            yield SynthesizedPiece(samples, int(result.token_count or 0))


class _Graphemes:
    """The factory model's phonemizer: the text as it is (KittenTTS's symbols include the
    letters and punctuation)."""

    def phonemize(self, texts: list[str]) -> list[str]:
        return list(texts)


def load_synthesis_model(path: Path) -> SynthesisModel:
    """Load the TTS model at `path`. Strict: a missing weight is an error. Raises
    `ModelLoadError` when its phonemizer is not installed (naming what to install). Makes
    MLX calls: call it on the thread that will use the model."""
    from mlx_audio.tts.utils import load_model

    from ._loading import ModelLoadError

    config = json.loads((path / "config.json").read_text("utf-8"))
    model_type = str(config.get("model_type"))
    graphemes = config.get("mlx_nursery_g2p") == "graphemes"
    if model_type == "kokoro":
        check_kokoro(path, graphemes)
    missing = None if graphemes else _missing_front_end(model_type)
    if missing is not None:
        raise ModelLoadError(f"{path}: this {model_type} model needs {missing}")
    try:
        model = load_model(str(path), strict=True)
    except (ValueError, KeyError, OSError, ImportError) as exc:
        raise ModelLoadError(f"{path}: not a TTS model mlx-audio can load ({exc})") from exc
    kokoro = KokoroSpeaker(model, path, graphemes) if model_type == "kokoro" else None
    if graphemes and kokoro is None:
        model._phonemizer = _Graphemes()
    voices = synthesis_voices(path, config)
    return SynthesisModel(path, model, model_type, int(model.sample_rate), voices, kokoro)


def synthesis_voices(path: Path, config: dict[str, Any]) -> tuple[str, ...]:
    """The voices of the TTS model at `path` (its `config`), read from its files without
    loading it (the model list shows them before the model loads): KittenTTS's `voices.npz`
    names and its config's aliases, Kokoro's English `voices/*.safetensors`."""
    if config.get("model_type") == "kokoro":
        return kokoro_voices(path)
    aliases = config.get("voice_aliases")
    names = set(aliases) if isinstance(aliases, dict) else set()
    try:
        with np.load(path / str(config.get("voices_path", "voices.npz"))) as voices:
            names.update(voices.files)
    except (OSError, ValueError):
        pass  # no voices: every voice is refused, and the load says why
    return tuple(sorted(names))


def _missing_front_end(model_type: str) -> str | None:
    """What the model's grapheme-to-phoneme front end lacks here (None: nothing)."""
    if model_type == "kitten_tts" and importlib.util.find_spec("phonemizer") is None:
        return "espeak for its phonemes (pip install phonemizer-fork; apt install espeak-ng)"
    return None
