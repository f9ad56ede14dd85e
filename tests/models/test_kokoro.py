"""Kokoro's English front end (misaki) without the internet: the load names what is
missing (misaki, then spaCy's `en_core_web_sm`, which misaki would download at first use:
the server never builds misaki's G2P without it), and with them the G2P's phonemes are what
the model speaks. misaki and spaCy are not installed here: stand-ins on `sys.path` play them
(`tests/http/test_http_speech_kokoro.py` serves the factory's Kokoro over HTTP)."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from mlx_nursery.models import ModelLoadError, load_synthesis_model, model_facts

G2P_STANDIN = """
import attrs

BUILT = []
CALLS = []


@attrs.define
class MToken:
    text: str
    phonemes: str
    whitespace: str
    start_ts: float | None = None
    end_ts: float | None = None


class G2P:
    def __init__(self, trf=False, british=False, fallback=None, unk="?"):
        BUILT.append({"trf": trf, "british": british, "fallback": fallback, "unk": unk})

    def __call__(self, text):
        CALLS.append(text)
        tokens = [MToken(w, "hI", " ") for w in text.split()]
        return " ".join(t.phonemes for t in tokens), tokens
"""


@pytest.fixture
def real_kokoro(tiny_kokoro: Path, tmp_path: Path) -> Path:
    """The factory's Kokoro without its marker: a Kokoro that needs misaki."""
    out = tmp_path / "kokoro"
    out.mkdir()
    config = json.loads((tiny_kokoro / "config.json").read_text("utf-8"))
    del config["mlx_nursery_g2p"]
    (out / "config.json").write_text(json.dumps(config), "utf-8")
    (out / "model.safetensors").symlink_to(tiny_kokoro / "model.safetensors")
    (out / "voices").symlink_to(tiny_kokoro / "voices")
    return out


def _package(root: Path, name: str, **modules: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / name / f"{module}.py").write_text(text)
    importlib.invalidate_caches()


def test_a_kokoro_loads_only_with_its_front_end_and_speaks_its_phonemes(
    real_kokoro: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = model_facts(real_kokoro)  # read before any load: the card's voices
    assert facts.kind == "tts" and facts.voices == ("af_alloy", "am_echo", "bf_fable", "bm_nova")
    if importlib.util.find_spec("misaki") is not None:
        pytest.skip("misaki is installed: the stand-ins would not be imported")
    with pytest.raises(ModelLoadError, match=r"misaki\[en\]"):
        load_synthesis_model(real_kokoro)

    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    _package(site, "misaki", en=G2P_STANDIN)
    _package(site, "spacy")
    try:
        with pytest.raises(ModelLoadError, match="python -m spacy download en_core_web_sm"):
            load_synthesis_model(real_kokoro)
        _package(site, "en_core_web_sm")
        model = load_synthesis_model(real_kokoro)
        assert model.voices == ("af_alloy", "am_echo", "bf_fable", "bm_nova")
        stand_in = importlib.import_module("misaki.en")
        assert stand_in.BUILT == [], "misaki's G2P is built at the first synthesis, not before"
        pieces = list(model.synthesize("Hi there.", "bf_fable", 1.0))
        # British: the voice's first letter; no espeak here, so no fallback (as mlx-audio).
        assert stand_in.BUILT == [{"trf": False, "british": True, "fallback": None, "unk": ""}]
        assert stand_in.CALLS == ["Hi there."]
        assert [p.tokens for p in pieces] == [len("hI hI")]  # its phonemes, not the letters
        assert all(len(p.samples) > 0 for p in pieces)
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in ("misaki", "spacy")]:
            del sys.modules[name]
        sys.modules.pop("en_core_web_sm", None)
        shutil.rmtree(site)
