"""A group that loses a rank must fail fast, never hang (issue 33's target: /health 503 within
the bound, the group exits non-zero, 0 hangs in 20 tries), measured with requests in flight.

Each try starts a tensor-parallel group of two ranks on the CPU (MLX's ring backend on the
loopback, rank by rank with the environment `mlx.launch --backend ring` gives each), starts
`--streams` streaming completions, and once every stream has its first tokens, kills rank 1
(SIGKILL: its connections drop) or stops it (SIGSTOP: alive and silent, so only rank 0's
bound on its wait can tell). Recorded per try: seconds from the fault to /health 503, to
every stream's end (and how it ended: an in-stream error, a closed connection, or finished),
to rank 0's exit, and rank 0's exit status. A try that passes `--hang-after` seconds without
rank 0 exiting is a hang (the processes are then killed).

Usage: `python -P bench/distributed_faults.py [--tries 20] [--faults killed stalled]
[--streams 4] [--timeout 8] [--out FILE]`; prints one JSON document (per fault: the tries and
a summary).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from mlx_nursery.tools import make_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_group(
    model: Path, port: int, logs: Path, timeout: float
) -> list[subprocess.Popen[bytes]]:
    hostfile = logs / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{_free_port()}"] for _ in range(2)]))
    command = [
        sys.executable, "-m", "mlx_nursery", "serve", "--model", str(model), "--port", str(port),
        "--max-concurrency", "8", "--distributed", "tensor",
        "--distributed-timeout", str(timeout),
    ]  # fmt: skip
    processes = []
    for rank in range(2):
        with (logs / f"rank{rank}.log").open("wb") as out:
            env = {**os.environ, "MLX_HOSTFILE": str(hostfile), "MLX_RANK": str(rank)}
            processes.append(
                subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
            )
    return processes


async def _until_healthy(client: httpx.AsyncClient, rank0: subprocess.Popen[bytes]) -> None:
    with trio.fail_after(180):
        while rank0.poll() is None:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.1)
    raise RuntimeError("the group ended before it served")


def _no_eos(model: Path) -> dict[str, int]:
    """A logit bias that keeps the model from ending a stream before the fault."""
    eos = json.loads((model / "config.json").read_text()).get("eos_token_id")
    return {str(i): -100 for i in ([eos] if isinstance(eos, int) else list(eos or []))}


async def _stream(
    client: httpx.AsyncClient, model: Path, seed: int, started: trio.Event, ends: list[Any]
) -> None:
    body = {
        "model": model.name, "prompt": f"Stream {seed} begins a long story.",
        "max_tokens": 2000, "temperature": 0.7, "seed": seed, "stream": True,
        "logit_bias": _no_eos(model),
    }  # fmt: skip
    ending = "finished"
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                ending = f"status {response.status_code}"
            else:
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and not started.is_set():
                        started.set()
                    if line.startswith("data: ") and '"error"' in line:
                        ending = "in-stream error"
    except httpx.HTTPError as exc:
        ending = f"connection: {type(exc).__name__}"
    finally:
        started.set()  # a stream that ends before its first token releases the fault too
    ends.append((ending, time.monotonic()))


async def _one_try(model: Path, fault: str, args: argparse.Namespace) -> dict[str, Any]:
    port = _free_port()
    with tempfile.TemporaryDirectory() as logs:
        rank0, rank1 = _start_group(model, port, Path(logs), args.timeout)
        result: dict[str, Any] = {"fault": fault}
        try:
            timeout = httpx.Timeout(args.hang_after, connect=5)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=timeout
            ) as client:
                await _until_healthy(client, rank0)
                ends: list[Any] = []
                events = [trio.Event() for _ in range(args.streams)]
                async with trio.open_nursery() as nursery:
                    for i, event in enumerate(events):
                        nursery.start_soon(_stream, client, model, i, event, ends)
                    with trio.fail_after(120):
                        for event in events:
                            await event.wait()
                    faulted = time.monotonic()
                    if fault == "killed":
                        rank1.kill()
                    else:
                        os.kill(rank1.pid, signal.SIGSTOP)
                    with trio.move_on_after(args.hang_after):
                        while True:
                            try:
                                health = await client.get("/health")
                            except httpx.TransportError:
                                result["health"] = "connection refused"
                                break
                            if health.status_code == 503:
                                result["health"] = "503"
                                result["detail"] = [p["detail"] for p in health.json()["problems"]]
                                break
                            await trio.sleep(0.05)
                    result["to_health_s"] = time.monotonic() - faulted
            result["stream_endings"] = sorted({e for e, _ in ends})
            result["to_streams_ended_s"] = max(t for _, t in ends) - faulted
            try:
                status = await trio.to_thread.run_sync(rank0.wait, args.hang_after)
                result["exit_status"] = status
                result["to_exit_s"] = time.monotonic() - faulted
                result["hang"] = False
            except subprocess.TimeoutExpired:
                result["hang"] = True
        finally:
            for process in (rank0, rank1):
                if process.poll() is None:
                    if fault == "stalled":
                        os.kill(process.pid, signal.SIGCONT)
                    process.kill()
                process.wait()
    return result


def _summary(tries: list[dict[str, Any]]) -> dict[str, Any]:
    health = [t["to_health_s"] for t in tries if t.get("health") == "503"]
    exits = [t["to_exit_s"] for t in tries if not t["hang"]]
    return {
        "tries": len(tries),
        "hangs": sum(t["hang"] for t in tries),
        "health_503": len(health),
        "nonzero_exits": sum(1 for t in tries if t.get("exit_status") not in (None, 0)),
        "to_health_s_median_max": [statistics.median(health), max(health)] if health else None,
        "to_exit_s_median_max": [statistics.median(exits), max(exits)] if exits else None,
        "stream_endings": sorted({e for t in tries for e in t["stream_endings"]}),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument(
        "--faults", nargs="+", choices=("killed", "stalled"), default=["killed", "stalled"]
    )
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=8.0, help="--distributed-timeout")
    parser.add_argument("--hang-after", type=float, default=60.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    report: dict[str, Any] = {"settings": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "tiny", "tiny", seed=0)
        for fault in args.faults:
            tries = []
            for i in range(args.tries):
                tries.append(await _one_try(model, fault, args))
                print(f"{fault} {i + 1}/{args.tries}: {json.dumps(tries[-1])}", file=sys.stderr)
            report[fault] = {"summary": _summary(tries), "tries": tries}
    text = json.dumps(report, indent=1)
    if args.out:
        await trio.Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    trio.run(main)
