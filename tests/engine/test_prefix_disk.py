"""The prefix cache's disk tier (`--prompt-cache-dir`, engine/_disk_*.py) through the real
engine: what one engine wrote, a fresh one on the same directory serves (the longest stored
prefix, only to the tenant that wrote it) as a cold run would; damaged, cut-short and
foreign files are refused, counted and deleted; the byte bound evicts the least recently
used. Its quantized round trip is in test_engine_kv_quant.py (the `small` model)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from safetensors import safe_open

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from tests.helpers import Run, collect

GREEDY = SamplingParams(temperature=0.0)
LENGTH = 300
"""A prompt's tokens: past the one block (256 tokens) the disk tier stores at least."""
NEW = 8


@attrs.frozen
class Stored:
    """A directory one engine wrote, and what it served cold."""

    directory: Path
    prompts: dict[str, list[int]]
    cold: dict[str, Run]


def _prompts(engine: Engine) -> dict[str, list[int]]:
    words = engine.model.tokenizer.encode("the river bends where the old mill stands " * 60)
    prompts = {"a": [4, *words[: LENGTH - 1]]}
    prompts["a-longer"] = prompts["a"] + words[LENGTH : 2 * LENGTH]
    for name, first in zip("bcd", (5, 6, 7), strict=True):
        prompts[name] = [first, *words[: LENGTH - 1]]
    return prompts


def _request(tokens: list[int], **kwargs: Any) -> GenerationRequest:
    return GenerationRequest(
        tokens, max_tokens=NEW, ignore_eos=True, sampling=GREEDY, logprobs=0, **kwargs
    )


def _config(model: Path, directory: Path, **kwargs: Any) -> EngineConfig:
    return EngineConfig(model, warmup=False, prompt_cache_dir=directory, **kwargs)


async def _serve(config: EngineConfig, prompts: dict[str, list[int]]) -> dict[str, Run]:
    """Each prompt in turn; the engine closed after (its disk writes done)."""
    async with open_engine(config) as engine:
        return {name: await collect(engine, _request(tokens)) for name, tokens in prompts.items()}


@pytest.fixture(scope="module")
def stored(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Stored:
    directory = tmp_path_factory.mktemp("prefix-disk")

    async def write() -> Stored:
        config = _config(tiny_model, directory)
        async with open_engine(config) as engine:
            prompts = _prompts(engine)
        return Stored(directory, prompts, await _serve(config, prompts))

    return trio.run(write)


def _file_of(directory: Path, prompt: list[int]) -> Path:
    """The file whose tokens begin with `prompt` and go on for the tokens generated."""
    for path in directory.iterdir():
        with safe_open(path, framework="numpy") as file:
            tokens = file.get_tensor("tokens").tolist()
        if tokens[: len(prompt)] == prompt and len(tokens) == len(prompt) + NEW - 1:
            return path
    raise AssertionError("no file holds this prompt")


def _logprobs(run: Run) -> list[float]:
    return [e.logprob.logprob for e in run.events if e.logprob is not None]


def _same_as_cold(run: Run, cold: Run) -> bool:
    return run.tokens == cold.tokens and _logprobs(run) == pytest.approx(_logprobs(cold), abs=1e-4)


async def test_a_restarted_engine_serves_the_longest_stored_prefix_to_its_tenant_alone(
    stored: Stored, tiny_model: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "kv"
    shutil.copytree(stored.directory, directory)
    prompts, cold = stored.prompts, stored.cold
    longer = prompts["a-longer"] + [9, 10, 11]  # a new question after the stored prefix
    async with open_engine(_config(tiny_model, directory)) as engine:
        same = await collect(engine, _request(prompts["b"]))
        after_one = engine.statistics().worker
        extended = await collect(engine, _request(longer))
        stranger = await collect(engine, _request(prompts["c"], cache_key="another tenant"))
        stats = engine.statistics().worker
    assert after_one is not None and stats is not None
    assert same.final.usage is not None and same.final.usage.cached_tokens == LENGTH - 1
    assert after_one.prompt_tokens_processed == 0  # the last token runs in the first decode
    assert _same_as_cold(same, cold["b"])
    # "a" and "a-longer" are both on disk: the file holding more of the prompt serves it.
    assert extended.final.usage is not None
    assert extended.final.usage.cached_tokens >= len(prompts["a-longer"])
    assert stranger.final.usage is not None and stranger.final.usage.cached_tokens == 0
    assert _same_as_cold(stranger, cold["c"])
    disk = stats.prefix_disk
    assert disk is not None and disk.rejected == 0
    assert (disk.hits, disk.hit_tokens) == (2, LENGTH - 1 + extended.final.usage.cached_tokens)


async def test_damaged_cut_short_and_foreign_files_are_refused_counted_and_deleted(
    stored: Stored, tiny_model: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "kv"
    shutil.copytree(stored.directory, directory)
    prompts = stored.prompts
    # Another model: the same architecture and config, other weights (a file's mtime says so).
    other_model = tmp_path / "other-model"
    shutil.copytree(tiny_model, other_model)
    for weights in other_model.glob("*.safetensors"):
        os.utime(weights, ns=(1, 1))
    other_directory = tmp_path / "other-kv"
    await _serve(_config(other_model, other_directory), {"d": prompts["d"]})

    damaged, cut, foreign = (_file_of(directory, prompts[n]) for n in "bcd")
    untouched = [_file_of(directory, prompts[n]) for n in ("a", "a-longer")]
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF  # in its KV data, past the header
    damaged.write_bytes(bytes(data))
    cut.write_bytes(cut.read_bytes()[:-100])
    foreign.write_bytes(_file_of(other_directory, prompts["d"]).read_bytes())
    garbage = directory / (foreign.name[:17] + "0" * 32 + ".kv.safetensors")
    garbage.write_bytes(b"not a prefix-cache file at all")
    refused = {path: path.read_bytes() for path in (damaged, cut, foreign)}

    async with open_engine(_config(tiny_model, directory)) as engine:
        runs = {n: await collect(engine, _request(prompts[n])) for n in "abcd"}
        stats = engine.statistics().worker
    for name in "bcd":
        usage = runs[name].final.usage
        assert usage is not None and usage.cached_tokens == 0, name
        assert _same_as_cold(runs[name], stored.cold[name]), name
    assert runs["a"].final.usage is not None
    assert runs["a"].final.usage.cached_tokens == LENGTH - 1
    assert stats is not None and stats.prefix_disk is not None
    assert stats.prefix_disk.rejected == 4  # the cut and foreign files at the scan, the
    # garbage too, the damaged one when read
    # Deleted; the cold runs of their prompts wrote whole files in their place.
    assert not garbage.exists()
    assert all(path.read_bytes() != content for path, content in refused.items())
    assert all(path.exists() for path in untouched)


async def test_the_byte_bound_evicts_the_least_recently_used_files(
    stored: Stored, tiny_model: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "kv"
    shutil.copytree(stored.directory, directory)  # mtimes kept: "a" the oldest, "d" the newest
    prompts = stored.prompts
    files = {name: _file_of(directory, prompts[name]) for name in prompts}
    size = files["b"].stat().st_size
    assert {files[n].stat().st_size for n in "bcd"} == {size}
    bound = 3 * size  # "b", "c", "d": the scan evicts "a" and "a-longer"
    new = [8, *prompts["b"][1:]]
    async with open_engine(_config(tiny_model, directory, prompt_cache_disk_bytes=bound)) as engine:
        read = await collect(engine, _request(prompts["b"]))  # "b" is now the newest
        stats = engine.statistics().worker
        await collect(engine, _request(new))  # written at the close: "c" must go
    assert stats is not None and stats.prefix_disk is not None
    assert stats.prefix_disk.evictions == 2
    assert read.final.usage is not None and read.final.usage.cached_tokens == LENGTH - 1
    kept = {files[n].name for n in ("b", "d")} | {_file_of(directory, new).name}
    assert {path.name for path in directory.iterdir()} == kept


async def test_a_read_in_flight_stalls_no_one_and_its_request_cancels_at_once(
    stored: Stored, tiny_model: Path, tmp_path: Path
) -> None:
    """A read that does not end (the file, once the engine has indexed it, is a pipe nobody
    writes yet) holds its request alone: another is served meanwhile, and a cancel ends the
    waiting request at once, its lane back, while the read is still blocked."""
    directory = tmp_path / "kv"
    shutil.copytree(stored.directory, directory)
    async with open_engine(_config(tiny_model, directory)) as engine:
        path = _file_of(directory, stored.prompts["b"])
        path.unlink()
        os.mkfifo(path)
        events: list[Any] = []

        async def waiting(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                async with engine.generate(_request(stored.prompts["b"])) as stream:
                    events.extend([event async for event in stream])

        pipes = []
        try:
            async with trio.open_nursery() as nursery:
                scope = await nursery.start(waiting)
                with trio.fail_after(30):  # a regression fails here rather than hanging
                    # Returns once the disk tier's reader has opened the pipe: the read began.
                    pipes.append(
                        await trio.to_thread.run_sync(open, path, "wb", abandon_on_cancel=True)
                    )
                    other = await collect(engine, _request(stored.prompts["c"][:100]))
                scope.cancel()
            lanes = engine.statistics().lanes_borrowed
        finally:
            for pipe in pipes:
                pipe.close()  # the read ends (an empty file: refused)
    assert other.final.finish_reason == "length" and len(other.tokens) == NEW
    assert events == []  # cancelled before it started: no token, nothing left running
    assert lanes == 0


async def test_a_read_expected_slower_than_its_prefill_is_skipped_and_a_faster_one_taken(
    stored: Stored, tiny_model: Path, tmp_path: Path
) -> None:
    """The rule of engine/_disk_rates.py with the read rate given (the prefill's measured
    by a cold prompt first): at a byte a second the stored prefix is prefilled instead, and
    counted; at a rate no disk reaches it is read, as a cold run. A memory tier smaller than
    any entry keeps nothing, and counts what it did not keep."""
    directory = tmp_path / "kv"
    shutil.copytree(stored.directory, directory)
    prompts, cold = stored.prompts, stored.cold
    runs, stats = {}, {}
    for first, rate in ((8, 1.0), (9, 1e18)):
        config = _config(
            tiny_model, directory, prompt_cache_disk_read_rate=rate, prompt_cache_bytes=1024
        )
        async with open_engine(config) as engine:
            fresh = [first, *prompts["b"][1:]]  # on no file: prefilled, measuring the prefill
            await collect(engine, _request(fresh))
            runs[rate] = await collect(engine, _request(prompts["b"]))
            stats[rate] = engine.statistics().worker
    slow, fast = (stats[rate] for rate in (1.0, 1e18))
    assert slow is not None and slow.prefill_seconds_per_token is not None
    assert slow.prefix_disk is not None and slow.prefix_disk.skipped_slower == 1
    assert slow.prefix_disk.hits == 0
    assert runs[1.0].final.usage is not None and runs[1.0].final.usage.cached_tokens == 0
    assert slow.prefix_cache is not None and slow.prefix_cache.too_large >= 1
    assert fast is not None and fast.prefix_disk is not None
    assert (fast.prefix_disk.hits, fast.prefix_disk.skipped_slower) == (1, 0)
    assert runs[1e18].final.usage is not None
    assert runs[1e18].final.usage.cached_tokens == LENGTH - 1
    for run in runs.values():
        assert _same_as_cold(run, cold["b"])


async def test_sequences_that_end_in_the_running_batch_are_stored_too(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Two prompts at once end in the batch, whose rows leave it as `RowKVCache`s: the disk
    tier stores them as it stores a lone sequence's."""
    directory = tmp_path / "kv"
    async with open_engine(_config(tiny_model, directory)) as engine:
        prompts = _prompts(engine)
        async with trio.open_nursery() as nursery:
            for name in ("b", "c"):
                nursery.start_soon(collect, engine, _request(prompts[name]))
    stored = []
    for path in directory.iterdir():
        with safe_open(path, framework="numpy") as file:
            stored.append(file.get_tensor("tokens").tolist())
    for name in ("b", "c"):  # the prompt and what was generated (a batch's row holds all)
        assert any(t[:LENGTH] == prompts[name] and len(t) > LENGTH for t in stored), name
