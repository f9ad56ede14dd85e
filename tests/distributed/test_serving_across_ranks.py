"""Serving one model across two ranks (`--distributed`), on the CPU over MLX's ring backend
on the loopback: the real server on rank 0, a real follower on rank 1.

One group per mode, under `mlx.launch` itself, serves the token and cancellation cases and
is then drained by SIGTERM: tensor parallel on the tiny preset (qwen3), pipeline parallel on
`tiny-qwen2` (mlx-lm splits qwen3 by tensor only), two layers a rank, with 8-bit KV. The
failure cases start groups of their own, rank by rank with the environment `mlx.launch
--backend ring` gives each (so that the test holds each rank's process: its pid to kill, its
exit status).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from mlx_nursery.cli import build_parser, serve_settings
from mlx_nursery.distributed import distributed_settings, start_rank
from mlx_nursery.engine import EngineConfig, GenerationRequest, SamplingParams, open_engine
from mlx_nursery.settings import SettingsError
from mlx_nursery.tools import make_model
from tests.helpers import collect

PROMPTS = [[5, 17, 42, 99], [7, 8], [300, 301, 302, 303, 304, 305], [1000, 3]]
LONG_PROMPT = [1000 + (i * 7) % 1000 for i in range(900)]
"""Its insert's record is over a broadcast frame's 4 KiB: it travels in two."""
MAX_TOKENS = 8


def _free_port(span: int = 1) -> int:
    """A port P with P..P+span-1 free now (`mlx.launch --starting-port P` takes P+1 too).

    Drawn below Linux's ephemeral range (32768 up), which the kernel hands to outgoing
    connections and to other tests' port-0 binds: between this check and the group's bind
    a port there may be taken, one here only by another pick of this kind."""
    rng = random.Random()
    while True:
        first = rng.randrange(20000, 32000 - span)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(first, first + span):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first


def _serve_command(model: Path, port: int, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "mlx_nursery", "serve", "--model", str(model),
        "--port", str(port), "--max-concurrency", "4", *flags,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@attrs.frozen
class Launched:
    """A group under `mlx.launch --verbose`: its output (every rank's) goes to `log`."""

    launcher: subprocess.Popen[bytes]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rank_pid(self, rank: int) -> int:
        """The pid of `rank`'s process (a child of the launcher, which execs each rank)."""
        tasks = Path(f"/proc/{self.launcher.pid}/task")  # its threads start the ranks
        for pid in (p for t in tasks.iterdir() for p in (t / "children").read_text().split()):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"MLX_RANK={rank}".encode() in environ:
                return int(pid)
        raise AssertionError(f"no process of rank {rank}")


async def _until_healthy(port: int, process: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        with trio.fail_after(90):
            while process.poll() is None:
                try:
                    if (await client.get("/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.1)
    raise AssertionError("the group ended before it served")


@attrs.frozen
class Served:
    """A group serving `model`, and what one process makes of the whole model."""

    group: Launched
    model: str
    """Its name in requests."""
    reference: list[str]
    """Each prompt's greedy text (`PROMPTS`, then `LONG_PROMPT`) from one process, on the
    whole model (no group)."""
    kv_bytes_per_token: int
    """What a token's KV costs in the whole model, in one process."""


def _one_process(model: Path, kv_bits: int | None) -> tuple[list[str], int]:
    config = EngineConfig(model, warmup=False, kv_bits=kv_bits, kv_group_size=32)  # heads of 32

    async def run() -> tuple[list[str], int]:
        async with open_engine(config) as engine:
            runs = [
                await collect(
                    engine,
                    GenerationRequest(
                        prompt, max_tokens=MAX_TOKENS, sampling=SamplingParams(temperature=0.0)
                    ),
                )
                for prompt in [*PROMPTS, LONG_PROMPT]
            ]
            return [run.text for run in runs], engine.model.kv_bytes_per_token

    return trio.run(run)


@pytest.fixture(scope="module", params=["tensor", "pipeline"])
def served(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One group per mode, one after the other (the last test of each drains it). The
    pipeline group quantizes its KV: the ranks but 0 hold their last layer's keys as
    `mx.depends` leaves them (the tensor group covers plain KV)."""
    mode: str = request.param
    if mode == "tensor":
        model, kv_bits = tiny_model, None
    else:
        model = make_model(tmp_path_factory.mktemp("models") / "tiny-qwen2", "tiny-qwen2")
        kv_bits = 8
    reference, kv_bytes_per_token = _one_process(model, kv_bits)
    kv_flags = [] if kv_bits is None else ["--kv-bits", str(kv_bits), "--kv-group-size", "32"]
    port = _free_port()
    log = tmp_path_factory.mktemp("group") / "launch.log"
    with log.open("wb") as out:
        launch = [str(Path(sys.executable).parent / "mlx.launch"), "-n", "2", "--verbose"]
        launcher = subprocess.Popen(
            [
                *launch,
                "--backend",
                "ring",
                "--starting-port",
                str(_free_port(span=2)),
                "--",
                # A loaded machine's step may take seconds: the bound is the failure tests'.
                *_serve_command(
                    model,
                    port,
                    "--distributed",
                    mode,
                    "--shutdown-grace",
                    "60",
                    "--distributed-timeout",
                    "60",
                ),
                *kv_flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,  # its ranks too can be ended together (a failed test)
        )
    launched = Launched(launcher, port, log)
    try:
        trio.run(_until_healthy, port, launcher)
        yield Served(launched, model.name, reference, kv_bytes_per_token)
    finally:
        # The launcher and any rank it left: a killed launcher does not end its ranks.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


async def _complete(client: httpx.AsyncClient, model: str, prompt: list[int], **fields: Any) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    response = await client.post("/v1/completions", json={**body, **fields})
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


async def test_the_group_gives_one_process_greedy_tokens(served: Served) -> None:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{served.group.port}", timeout=60
    ) as client:
        prompts = [*PROMPTS, LONG_PROMPT]
        texts = [await _complete(client, served.model, prompt) for prompt in prompts]
    assert texts == served.reference


def test_each_rank_budgets_only_its_own_share_of_the_kv(served: Served) -> None:
    """Tensor ranks hold half of every layer's KV heads, pipeline ranks half the layers: on
    both ranks a token's KV costs half of the whole model's (the KV budget counts that)."""
    output = served.group.output()
    leader = re.search(r"KV budget: \d+ tokens \((\d+) bytes per token\)", output)
    follower = re.search(r"rank 1: following rank 0 \(\w+ parallel; (\d+) bytes of KV", output)
    assert leader is not None and follower is not None, output
    half = served.kv_bytes_per_token // 2
    assert (int(leader.group(1)), int(follower.group(1))) == (half, half)


async def test_concurrent_requests_keep_their_solo_tokens(served: Served) -> None:
    texts: dict[int, str] = {}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{served.group.port}", timeout=60
    ) as client:

        async def one(i: int) -> None:
            texts[i] = await _complete(client, served.model, PROMPTS[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(PROMPTS)):
                nursery.start_soon(one, i)
    assert [texts[i] for i in range(len(PROMPTS))] == served.reference[: len(PROMPTS)]


async def test_a_dropped_stream_stops_on_both_ranks_and_sigterm_drains_the_group(
    served: Served,
) -> None:
    long = 4000
    group = served.group
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{group.port}", timeout=60) as client:
        body = {"model": served.model, "prompt": PROMPTS[0], "max_tokens": long, "temperature": 0}
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            chunks = 0
            async for line in r.aiter_lines():
                chunks += line.startswith("data: ")
                if chunks == 3:
                    break  # the client goes away mid-stream
        # A request in flight when SIGTERM comes is drained: it finishes whole. (16 tokens:
        # the signal comes as soon as its response starts, each step is a round of the ring.)
        drained: list[str] = []

        async def in_flight(task_status: trio.TaskStatus[None]) -> None:
            async with client.stream(
                "POST", "/v1/completions", json={**body, "max_tokens": 16, "stream": True}
            ) as r:
                task_status.started()
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        event = json.loads(line[6:])
                        assert "choices" in event, event
                        drained.append(event["choices"][0]["finish_reason"])

        async with trio.open_nursery() as nursery:
            await nursery.start(in_flight)
            os.kill(group.rank_pid(0), signal.SIGTERM)
    status = await trio.to_thread.run_sync(group.launcher.wait, 60)
    output = group.output()
    assert status == 0
    assert "Node with rank 0 completed" in output
    assert "Node with rank 1 completed" in output
    assert drained[-1] == "length"
    match = re.search(r"mlx-nursery follower 1: (\{.*\})", output)
    assert match is not None, output
    counters = json.loads(match.group(1))
    assert counters["active"] == 0
    # The dropped stream: removed on the follower long before its max_tokens; the drained
    # one ran to its end there too.
    (stopped,) = counters["removed"].values()
    assert 3 <= stopped < long
    assert counters["finished"] >= 1 + 2 * len(PROMPTS)


def _ranks(models: list[Path], port: int, logs: Path, *flags: str) -> list[subprocess.Popen[bytes]]:
    """A group started rank by rank, each with the environment `mlx.launch --backend ring`
    gives it (MLX_HOSTFILE, MLX_RANK), rank r serving `models[r]`."""
    hostfile = logs / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{_free_port()}"] for _ in models]))
    processes = []
    for rank, model in enumerate(models):
        with (logs / f"rank{rank}.log").open("wb") as out:
            processes.append(
                subprocess.Popen(
                    _serve_command(model, port, "--distributed", "tensor", *flags),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**_env(), "MLX_HOSTFILE": str(hostfile), "MLX_RANK": str(rank)},
                )
            )
    return processes


def _kill_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """End a test's ranks, whatever state it left them in (a stopped one dies too)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.parametrize("fault", ["killed", "stalled"])
async def test_a_failed_follower_fails_the_group_fast_not_a_hang(
    tiny_model: Path, tmp_path: Path, fault: str
) -> None:
    """A killed follower (its connection lost) and a stalled one (alive, stopped: only the
    bound on rank 0's wait can tell) both turn /health 503 and end the group non-zero."""
    port = _free_port()
    rank0, rank1 = _ranks([tiny_model] * 2, port, tmp_path, "--distributed-timeout", "3")
    try:
        await _until_healthy(port, rank0)
        if fault == "killed":
            rank1.kill()
        else:
            os.kill(rank1.pid, signal.SIGSTOP)
        details: list[str] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            with trio.fail_after(30):  # the bound: the timeout, and the process's exit
                while not details:
                    try:
                        health = await client.get("/health")
                    except httpx.TransportError:
                        if rank0.poll() is None:
                            continue
                        # Gone (2 s after its report) before a poll of a loaded machine came:
                        # its log holds what /health said.
                        log = (tmp_path / "rank0.log").read_text(errors="replace")
                        details = [
                            line for line in log.splitlines() if "distributed group:" in line
                        ]
                        assert details, log
                        break
                    if health.status_code == 503:
                        details = [problem["detail"] for problem in health.json()["problems"]]
        # The group's problem names the rank; the engine it failed may be listed beside it.
        assert any("rank 1" in detail for detail in details), details
        status = await trio.to_thread.run_sync(rank0.wait, 30)
        assert status != 0
    finally:
        _kill_all([rank0, rank1])


def _text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


async def _until_logged(log: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    with trio.fail_after(90):
        while text not in _text(log):
            assert process.poll() is None, _text(log)
            await trio.sleep(0.05)


def _linked_copies(model: Path, into: Path, n: int) -> list[Path]:
    """`n` directories holding `model`'s files (links): one per rank, each its own."""
    copies = []
    for i in range(n):
        directory = into / f"model{i}"
        directory.mkdir()
        for item in model.iterdir():
            (directory / item.name).symlink_to(item)
        copies.append(directory)
    return copies


async def test_a_rank_late_to_the_first_meeting_is_waited_for(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Ranks reach the model check after loading and hashing the model at their own disk's
    pace: one arriving later than the step bound still forms the group, which serves.

    Rank 1's directory holds one more weight file that only the model check reads, a FIFO
    (rank 0's: an empty file): rank 1 waits on it until the test opens it, here 5 s after
    rank 0 has reached the check, against a 3 s step bound."""
    models = _linked_copies(tiny_model, tmp_path, 2)
    (models[0] / "zz-late.safetensors").write_bytes(b"")
    late = models[1] / "zz-late.safetensors"
    os.mkfifo(late)
    port = _free_port()
    rank0, rank1 = _ranks(models, port, tmp_path, "--distributed-timeout", "3")
    try:
        await _until_logged(tmp_path / "rank0.log", "waiting for every rank", rank0)
        await trio.sleep(5)  # the lateness under test (past the bound), not a synchronization
        assert "waiting for every rank" not in _text(tmp_path / "rank1.log")
        # Rank 1 reads the FIFO once a writer opens it; closing gives it an empty file.
        with trio.fail_after(60):
            while True:
                try:
                    os.close(os.open(late, os.O_WRONLY | os.O_NONBLOCK))
                    break
                except OSError as exc:  # ENXIO: rank 1 has not opened it for reading yet
                    assert exc.errno == errno.ENXIO, exc
                    assert rank1.poll() is None, _text(tmp_path / "rank1.log")
                    await trio.sleep(0.05)
        await _until_healthy(port, rank0)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            body = {"model": models[0].name, "prompt": "hello", "max_tokens": 4}
            response = await client.post("/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1
    finally:
        _kill_all([rank0, rank1])


async def test_a_mismatched_model_is_refused_on_every_rank(
    tiny_model: Path, tmp_path: Path
) -> None:
    other = make_model(tmp_path / "other", "tiny", seed=1)  # same shapes, other weights
    processes = _ranks([tiny_model, other], _free_port(), tmp_path)
    try:
        statuses = [await trio.to_thread.run_sync(p.wait, 90) for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert all(status != 0 for status in statuses)
    for rank in (0, 1):
        assert "differ from rank 0's" in (tmp_path / f"rank{rank}.log").read_text()


@pytest.mark.parametrize(
    ("mode", "refusal"),
    [
        ("pipeline", r"has no pipeline parallelism; --distributed pipeline serves: .*qwen2"),
        ("tensor", r"runs under `mlx.launch` with two ranks or more"),
    ],
)
def test_what_cannot_be_split_is_refused_at_startup(
    tiny_model: Path, mode: str, refusal: str
) -> None:
    """The tiny preset (qwen3) has tensor parallelism in mlx-lm, not pipeline; one process
    alone is no group. (`serve` prints the refusal and exits 2: cli.py.)"""
    settings = distributed_settings(
        serve_settings(build_parser().parse_args(["serve", "--model", str(tiny_model),
                                                  "--distributed", mode]), environ={})
    )  # fmt: skip
    with pytest.raises(SettingsError, match=refusal):
        start_rank(settings, str(tiny_model))


def test_every_rank_sets_mlx_backend_switches_before_the_group_forms(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower runs its shard with rank 0's kernels: the command line's CUDA switches
    are set in each rank's own environment (MLX reads them once, at its first work on the
    GPU) before the group forms, here seen on a process that is then refused as no group."""
    monkeypatch.delenv("MLX_USE_CUDA_GRAPHS", raising=False)
    monkeypatch.delenv("MLX_CUDA_USE_CUDNN_SDPA", raising=False)
    args = ["serve", "--model", str(tiny_model), "--distributed", "tensor", "--cuda-graphs"]
    settings = distributed_settings(serve_settings(build_parser().parse_args(args), environ={}))
    with pytest.raises(SettingsError, match="two ranks or more"):
        start_rank(settings, str(tiny_model))
    assert os.environ["MLX_USE_CUDA_GRAPHS"] == "1"
    assert os.environ["MLX_CUDA_USE_CUDNN_SDPA"] == "0"
