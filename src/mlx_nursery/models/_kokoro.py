"""Kokoro's text-to-audio path, without the downloads mlx-audio's `model.generate` may make.

mlx-audio's `Model.generate` builds a `KokoroPipeline`, whose English front end is misaki's
`G2P`: when spaCy's `en_core_web_sm` is not installed, misaki calls `spacy.cli.download` at
that first use (a download from the internet, silently, from a request). The pipeline also
fetches from the model hub any voice it does not find under the model's `voices/`. Neither
belongs in a server: so this module checks the front end when the model loads (the load
error names what to install: `misaki[en]`, then `python -m spacy download en_core_web_sm`),
builds misaki's G2P itself only once its spaCy model is there, and hands the pipeline each
voice as the path of its file (a path is loaded as it is, never looked up on the hub).

The audio is still mlx-audio's: `KokoroPipeline.generate_from_tokens` (its chunking at 510
phonemes, American English's flap, `infer`) on the phonemes made here. Only English voices
are served (American `a*`, British `b*`): the other languages' front ends (espeak through
misaki, misaki's Japanese and Chinese extras) are not tested here, so their voices are not
listed. A model written by the factory (`"mlx_nursery_g2p": "graphemes"`) takes its text as
its phonemes: its vocabulary holds the letters, and random weights do not mind.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import textwrap
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("mlx_nursery.models")

KOKORO_LANGUAGES = {"a": False, "b": True}
"""The voices' first letters served, each with whether it is British English."""
_SPACY_MODEL = "en_core_web_sm"
_PHONEMES_MAX = 510
"""Kokoro's limit per forward (its voice packs have a style row per length up to it)."""


def kokoro_voices(path: Path) -> tuple[str, ...]:
    """The English voices of the Kokoro model at `path` (`voices/*.safetensors`), read
    without loading it."""
    files = (path / "voices").glob("*.safetensors")
    return tuple(sorted(p.stem for p in files if p.stem[:1] in KOKORO_LANGUAGES))


def missing_kokoro_front_end() -> str | None:
    """What Kokoro's English front end lacks here (None: nothing). Checked without importing
    misaki or spaCy (slow), so that a load fails at once and nothing is ever downloaded."""
    if importlib.util.find_spec("misaki") is None or importlib.util.find_spec("spacy") is None:
        return "misaki for its phonemes (pip install 'misaki[en]')"
    if importlib.util.find_spec(_SPACY_MODEL) is None:
        return (
            f"spaCy's {_SPACY_MODEL} for misaki's English phonemes (python -m spacy download "
            f"{_SPACY_MODEL}; misaki would fetch it at first use, the server never does)"
        )
    return None


class KokoroSpeaker:
    """Speaks with one loaded Kokoro model; to be used only from the thread that loaded it
    (every call may make MLX calls)."""

    def __init__(self, model: Any, path: Path, graphemes: bool) -> None:
        from mlx_audio.tts.models.kokoro.pipeline import KokoroPipeline

        self._path = path
        self._graphemes = graphemes
        self._g2p: dict[str, Any] = {}
        # A pipeline without its constructor, which would build misaki's G2P (and so maybe
        # download). `generate_from_tokens` uses only these attributes; `voices` caches packs.
        pipeline = KokoroPipeline.__new__(KokoroPipeline)
        pipeline.model, pipeline.voices, pipeline.lang_code = model, {}, "a"
        pipeline.repo_id, pipeline.model_path = str(path), path
        self._pipeline = pipeline

    def pieces(self, text: str, voice: str, speed: float) -> Generator[tuple[Any, int], None, None]:
        """(audio, phonemes) per forward for `text` in `voice`: one forward per 510 phonemes.
        A generator: closing it stops before the next forward."""
        pack = str(self._path / "voices" / f"{voice}.safetensors")
        if self._graphemes:
            parts: list[Any] = textwrap.wrap(text, _PHONEMES_MAX) or [text]
        else:
            _, tokens = self._front_end(voice[:1])(text)
            parts = [tokens]
        for part in parts:
            for result in self._pipeline.generate_from_tokens(part, voice=pack, speed=speed):
                if result.audio is not None:
                    yield np.asarray(result.audio), len(result.phonemes)

    def _front_end(self, language: str) -> Any:
        """misaki's English G2P for `language` ("a" or "b"), built at first use (a spaCy
        load, about a second). Its spaCy model was checked at the load: this never
        downloads. espeak (misaki's fallback for words its lexicon lacks) is used where
        misaki's espeak module loads, as mlx-audio does; else such words are left out."""
        if language not in self._g2p:
            english = importlib.import_module("misaki.en")
            british = KOKORO_LANGUAGES[language]
            fallback = None
            try:
                espeak = importlib.import_module("misaki.espeak")
                fallback = espeak.EspeakFallback(british=british)
            except Exception as exc:  # noqa: BLE001 - any failure: no fallback, as mlx-audio
                log.warning("Kokoro: no espeak fallback (%s): unknown words are skipped", exc)
            self._g2p[language] = english.G2P(trf=False, british=british, fallback=fallback, unk="")
        return self._g2p[language]


def check_kokoro(path: Path, graphemes: bool) -> None:
    """Raise `ModelLoadError` when the Kokoro model at `path` cannot speak here."""
    from ._loading import ModelLoadError  # it imports this module's users

    missing = None if graphemes else missing_kokoro_front_end()
    if missing is not None:
        raise ModelLoadError(f"{path}: this kokoro model needs {missing}")
    if not kokoro_voices(path):
        raise ModelLoadError(f"{path}: no English voice in its voices/ directory")
