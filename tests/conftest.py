from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from mlx_nursery.engine import Engine, EngineConfig, open_engine
from mlx_nursery.models import release_mlx_streams
from mlx_nursery.tools import make_model

from .helpers import TextlessIds, with_textless_ids
from .postgres import PostgresServer, postgres_server
from .postgres import why_not as postgres_unavailable

# Every engine of the suite (in-process or served) asserts its thread's invariants after each
# iteration: a violation stops it, and the test sees the failure.
os.environ["MLX_NURSERY_CHECK_INVARIANTS"] = "1"
# The servers the tests start as processes keep their stored responses in memory unless a
# test gives them a store: never the user's own file, which test processes running at once
# would share (and each one's startup marks the others' unfinished responses failed).
os.environ.setdefault("MLX_NURSERY_RESPONSES_DB", ":memory:")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # The main thread made MLX streams (model factory, cache unit tests): MLX needs them
    # destroyed before interpreter shutdown or the process may abort (ml-explore/mlx#4327).
    release_mlx_streams()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def textless_ids(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> TextlessIds:
    """The tiny model with holes in its vocabulary and rows past its tokenizer."""
    return with_textless_ids(tiny_model, tmp_path_factory.mktemp("models") / "textless")


@pytest.fixture(scope="session")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `small` preset: heads of 32, for KV quantization's group size."""
    return make_model(tmp_path_factory.mktemp("models") / "small", "small", seed=0)


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `tiny-thinking` preset: a Qwen3-style template that thinks."""
    return make_model(tmp_path_factory.mktemp("models") / "thinking", "tiny-thinking", seed=0)


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny-vlm", "tiny-vlm", seed=0)


@pytest.fixture(scope="session")
def tiny_embedding(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny-embedding", "tiny-embedding")


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny-reranker", "tiny-reranker")


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny-whisper", "tiny-whisper", seed=0)


@pytest.fixture
def ffmpeg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """imageio-ffmpeg's build (a test dependency) on PATH as `ffmpeg`, for the containers
    only ffmpeg decodes."""
    import imageio_ffmpeg

    directory = tmp_path / "bin"
    directory.mkdir()
    program = directory / "ffmpeg"
    program.symlink_to(imageio_ffmpeg.get_ffmpeg_exe())
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")
    return program


@pytest.fixture(scope="session")
def tiny_tts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny-tts", "tiny-tts", seed=0)


@pytest.fixture(scope="session")
def tiny_kokoro(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny-kokoro", "tiny-kokoro", seed=0)


@pytest.fixture
def engine_config(tiny_model: Path) -> EngineConfig:
    """The tiny model's engine for tests, its warm-up minimal: the first phase only (the
    warm-up's own tests run every phase)."""
    return EngineConfig(
        tiny_model, max_concurrency=8, max_queue=8, prefill_step_size=64, warmup_budget_s=0.0
    )


@pytest.fixture
async def engine(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    async with open_engine(engine_config) as running:
        yield running


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (tests/postgres.py); skips where none can run."""
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(f"no PostgreSQL server: {reason}")
    with postgres_server() as server:
        yield server
