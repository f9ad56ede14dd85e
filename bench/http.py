"""HTTP benchmark: mlx-nursery through HTTP vs its own engine, and vs mlx_lm.server.

Measures, on one model, each server in its own process, the client here:
  1. single stream: decode tok/s through HTTP streaming vs the engine in-process, run back
     to back round by round (the median of the rounds' ratios);
  2. aggregate tok/s at 1 and 32 concurrent streams, and median time to first token;
  3. compute after a disconnect: a non-streaming request (and a streaming one) is
     dropped by its client; the server process's CPU time over the next seconds,
     divided by its CPU time per generated token (calibrated in the same run),
     estimates the tokens it kept generating. A black-box measure that works for
     any server; it is meaningful on the CPU backend, where compute is CPU time.

Random weights never stop by themselves only if EOS cannot be sampled: both
servers get `logit_bias` {eos: -100} and a fixed max_tokens.

Usage:
  python bench/http.py --preset small                 # CPU, ~5 minutes on 2 cores
  python bench/http.py --model PATH --streams 32
"""

from __future__ import annotations

import sys

# This file is named http.py, as asked; run as a script its folder comes first on sys.path
# and would shadow the standard library's `http` package. Drop it before any other import.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server_process(
    kind: str, model: Path, port: int, concurrency: int
) -> Iterator[subprocess.Popen[bytes]]:
    if kind.startswith("mlx-nursery"):
        # "mlx-nursery:N" serves with --stream-interval N; plain "mlx-nursery" with the default
        interval = kind.partition(":")[2]
        command = [
            sys.executable,
            "-m",
            "mlx_nursery",
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            "--max-concurrency",
            str(concurrency),
            "--served-model-name",
            "bench",
            "--log-level",
            "warning",
            *(["--stream-interval", interval] if interval else []),
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "mlx_lm",
            "server",
            "--model",
            str(model),
            "--port",
            str(port),
            "--decode-concurrency",
            str(concurrency),
            "--log-level",
            "WARNING",
        ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{kind} did not become healthy")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def body(model_name: str, eos: int, max_tokens: int, stream: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": model_name,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logit_bias": {str(eos): -100},
        "stream": stream,
    }
    if stream:
        doc["stream_options"] = {"include_usage": True}
    return doc


async def one_stream(http: httpx.AsyncClient, doc: dict[str, Any]) -> dict[str, float]:
    start = time.perf_counter()
    first = last = None
    tokens = 0
    async with http.stream("POST", "/v1/chat/completions", json=doc) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    assert first is not None and last is not None and tokens > 1
    return {
        "ttft": first - start,
        "decode_tps": (tokens - 1) / (last - first),
        "tokens": tokens,
        "start": start,
        "end": last,
    }


async def concurrent(base: str, doc: dict[str, Any], streams: int) -> dict[str, float]:
    results: list[dict[str, float]] = []
    resets = [0]
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as http:

        async def run() -> None:
            # Retry a refused/reset connection as the SDKs do: mlx_lm.server's stdlib server
            # listens with a backlog of 5 and resets the rest of a burst of connections.
            for attempt in range(10):
                try:
                    results.append(await one_stream(http, doc))
                    return
                except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                    resets[0] += 1
                    await trio.sleep(0.05 * (attempt + 1))
            raise RuntimeError("gave up after 10 connection resets")

        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(run)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "streams": streams,
        "aggregate_tps": sum(r["tokens"] for r in results) / wall,
        "ttft_median_s": statistics.median(r["ttft"] for r in results),
        "single_decode_tps": statistics.median(r["decode_tps"] for r in results),
        "connection_resets": resets[0],
    }


async def disconnect_cost(
    base: str, pid: int, doc: dict[str, Any], watch: float, stream: bool, cpu_per_token: float
) -> float:
    """Estimated tokens computed after the client dropped a request."""
    doc = {**doc, "stream": stream}
    doc.pop("stream_options", None)
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        with trio.move_on_after(1.0):  # let it start generating, then drop the connection
            await http.post("/v1/chat/completions", json=doc)
    before = cpu_seconds(pid)
    await trio.sleep(watch)
    return max(0.0, cpu_seconds(pid) - before) / cpu_per_token


async def measure_server(
    kind: str,
    model: Path,
    eos: int,
    args: argparse.Namespace,
    engine_once: Callable[[], Awaitable[float]],
) -> dict[str, Any]:
    port = free_port()
    name = "bench" if kind.startswith("mlx-nursery") else str(model)
    with server_process(kind, model, port, args.streams) as process:
        base = f"http://127.0.0.1:{port}"
        doc = body(name, eos, args.tokens, stream=True)
        # Warm-up at both sizes measured: the first batch of `streams` compiles kernels for its
        # shapes (on the H100, the first 32-stream run of the first server ran at half speed).
        await concurrent(base, {**doc, "max_tokens": 8}, 2)
        await concurrent(base, {**doc, "max_tokens": 16}, args.streams)
        # Each HTTP run is paired with an in-process engine run just before it: on a shared
        # GPU host the same loop drifts 10-20% between minutes, so only pairs compare.
        singles, engine_runs, cpu = [], [], 0.0
        for _ in range(args.repeats):
            engine_runs.append(await engine_once())
            cpu0 = cpu_seconds(process.pid)
            singles.append(await concurrent(base, doc, 1))
            cpu += cpu_seconds(process.pid) - cpu0
        cpu_per_token = cpu / (args.tokens * args.repeats)
        single = {key: statistics.median(run[key] for run in singles) for key in singles[0]}
        ratios = [
            run["single_decode_tps"] / tps for run, tps in zip(singles, engine_runs, strict=True)
        ]
        # Median of a few: one 32-stream run lasts seconds, and the host drifts more than that.
        runs = [await concurrent(base, doc, args.streams) for _ in range(args.batch_repeats)]
        batched = {
            **sorted(runs, key=lambda r: r["aggregate_tps"])[len(runs) // 2],
            "aggregate_tps_runs": [r["aggregate_tps"] for r in runs],
        }
        long_doc = body(name, eos, args.disconnect_tokens, stream=False)
        # Streaming first: a non-streaming orphan would still be running during the other watch.
        after_streaming = await disconnect_cost(
            base, process.pid, long_doc, args.watch, True, cpu_per_token
        )
        after_non_streaming = await disconnect_cost(
            base, process.pid, long_doc, args.watch, False, cpu_per_token
        )
    return {
        "server": kind,
        "single": single,
        "batched": batched,
        "engine_single_tps": statistics.median(engine_runs),
        "vs_engine": statistics.median(ratios),
        "vs_engine_rounds": ratios,
        "tokens_after_disconnect": {
            "non_streaming": after_non_streaming,
            "streaming": after_streaming,
        },
    }


async def measure_all(model: Path, eos: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every server in turn, beside one in-process engine that gives each single-stream run
    its reference."""
    from mlx_nursery.engine import EngineConfig, GenerationRequest, SamplingParams, open_engine

    async with open_engine(EngineConfig(model, max_concurrency=1)) as engine:
        tokenizer = engine.model.tokenizer
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}], add_generation_prompt=True
        )
        request = GenerationRequest(
            ids, args.tokens, sampling=SamplingParams(temperature=0.0, logit_bias={eos: -100.0})
        )

        async def engine_once() -> float:
            times = []
            async with engine.generate(request) as stream:
                async for event in stream:
                    if event.token_id is not None:
                        times.append(time.perf_counter())
            return (len(times) - 1) / (times[-1] - times[0])

        await engine_once()  # warm-up
        return [
            await measure_server(kind, model, eos, args, engine_once)
            for kind in args.servers.split(",")
        ]


def model_path(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    from mlx_nursery.models import make_model

    out = Path(tempfile.gettempdir()) / f"mlx-nursery-bench-{args.preset}"
    if not (out / "config.json").exists():
        make_model(out, args.preset)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model", help="a model directory (overrides --preset)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="single-stream runs (median)")
    parser.add_argument("--batch-repeats", type=int, default=3, help="runs at --streams (median)")
    parser.add_argument("--disconnect-tokens", type=int, default=2000)
    parser.add_argument(
        "--watch", type=float, default=4.0, help="seconds of CPU watched after a drop"
    )
    parser.add_argument(
        "--servers",
        default="mlx-nursery,mlx_lm.server",
        help='comma-separated; "mlx-nursery:N" serves with --stream-interval N',
    )
    parser.add_argument("--json", default="bench/results/http.json")
    args = parser.parse_args()

    model = model_path(args)
    config = json.loads((model / "config.json").read_text())
    eos = config["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    rows = trio.run(measure_all, model, eos, args)

    print(
        f"\nmodel {model.name}, {args.tokens} tokens per stream, {args.streams} streams; "
        f"'vs engine': median over {args.repeats} rounds of HTTP / in-process engine,"
        " run back to back"
    )
    header = (
        "server",
        "1 stream tok/s",
        "engine tok/s",
        "vs engine",
        f"{args.streams} streams tok/s",
        "TTFT@1 ms",
        f"TTFT@{args.streams} ms",
        "after drop (non-stream)",
        "after drop (stream)",
    )
    print(" | ".join(header))
    for row in rows:
        single, batched, drop = row["single"], row["batched"], row["tokens_after_disconnect"]
        print(
            " | ".join(
                [
                    row["server"],
                    f"{single['single_decode_tps']:.1f}",
                    f"{row['engine_single_tps']:.1f}",
                    f"{row['vs_engine']:.3f}",
                    f"{batched['aggregate_tps']:.1f}",
                    f"{single['ttft_median_s'] * 1000:.0f}",
                    f"{batched['ttft_median_s'] * 1000:.0f}",
                    f"{drop['non_streaming']:.0f}",
                    f"{drop['streaming']:.0f}",
                ]
            )
        )
    reference = next((r for r in rows if r["server"] == "mlx_lm.server"), None)
    for row in rows:
        if reference is not None and row is not reference:
            print(
                f"aggregate at {args.streams} streams, {row['server']} / mlx_lm.server: "
                f"{row['batched']['aggregate_tps'] / reference['batched']['aggregate_tps']:.2f}x"
            )
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "model": str(model),
        "args": vars(args),
        "servers": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    try:
        main()
    finally:
        from mlx_nursery.cli import release_mlx_streams

        release_mlx_streams()
