"""The long fuzz and the soak of issue 15, against `mlx-nursery serve` in a process of its own.

fuzz: the strategies of tests/http/test_fuzz.py (valid, almost-valid and hostile requests for chat,
  completions and Responses, streaming and not) for N cases, one at a time. Counts the cases,
  statuses, 5xx, broken streams, error envelopes and engine deaths (/health not 200 after a
  case; the server is then restarted so that the run goes on), and lists each distinct failure
  with its smallest request and, for a 500, where the server's log says it came from. A thread
  polls /health meanwhile on its own connection: a case that blocks the server shows there.

soak: thousands of mixed requests (chat, completions, Responses; streaming and not; prompts
  of a few to ~2800 tokens; temperature > 0 with and without seeds) at concurrency 16,
  ~30% of clients leaving at a random moment and some with short timeouts. Measures, from
  /proc, the server's threads, file descriptors and RSS before and after, its CPU once the
  load ends, time to first token before and after, and every status. Lanes and queue are not
  measured here: no endpoint exposes the engine's statistics (tests/http/test_soak.py checks them
  in process).

Usage:
  python bench/fuzz_soak.py fuzz --cases 10000              # ~15 minutes on 2 CPU cores
  python bench/fuzz_soak.py soak --requests 10000           # ~15 minutes on 2 CPU cores
  python bench/fuzz_soak.py fuzz --cases 300 --json out.json
"""

from __future__ import annotations

import sys

# Run as a script, this folder comes first on sys.path, and its http.py would shadow the
# standard library's `http` package (httpx needs it): drop the folder before other imports.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import collections
import json
import math
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.http.test_fuzz import (
    MODEL,
    Case,
    Judge,
    Outcome,
    Target,
    almost_valid_case,
    hostile_case,
    valid_case,
)

FLAVOURS = {"valid": 0.3, "almost": 0.3, "hostile": 0.4}


# -- the server process -----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mlx_memory_mb(base: str) -> dict[str, float]:
    """MLX's own counters from the server's /metrics: bytes in arrays and freed buffers it
    keeps for reuse, so that RSS growth can be split into what MLX caches and the rest."""
    text = httpx.get(base + "/metrics", timeout=30).text
    found = {}
    for name in ("memory_active_bytes", "memory_cache_bytes"):
        match = re.search(rf"^mlx_nursery:{name} (\S+)$", text, re.MULTILINE)
        found[name.removesuffix("_bytes")] = (
            round(float(match.group(1)) / 2**20, 1) if match else math.nan
        )
    return found


def proc_status(pid: int) -> dict[str, int]:
    """Threads, open file descriptors, RSS (bytes) and CPU ticks of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]
    rss = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024  # type: ignore[union-attr]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {
        "threads": threads,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "rss": rss,
        "cpu_ticks": int(fields[11]) + int(fields[12]),
    }


def cpu_seconds(pid: int) -> float:
    return proc_status(pid)["cpu_ticks"] / os.sysconf("SC_CLK_TCK")


class Server:
    """`mlx-nursery serve` as a child process; its log goes to a file."""

    def __init__(self, model: Path, log: Path, *extra: str) -> None:
        self.model, self.log_path, self.extra = model, log, extra
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url = ""
        self.starts = 0

    def start(self) -> None:
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "mlx_nursery",
            "serve",
            "--model",
            str(self.model),
            "--port",
            str(port),
            "--served-model-name",
            MODEL,
            "--responses-db",
            ":memory:",
            *self.extra,
        ]
        log = self.log_path.open("ab")
        log.write(f"\n=== start {self.starts} ===\n".encode())
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.base_url = f"http://127.0.0.1:{port}"
        self.starts += 1
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.process.returncode}; see {self.log_path}"
                )
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the server did not become healthy")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 60 s; the exit status."""
        if self.process is None:
            return None
        self.process.terminate()
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


def model_dir(given: str | None, scratch: Path) -> Path:
    if given:
        return Path(given)
    path = scratch / "tiny"
    subprocess.run(
        [sys.executable, "-m", "mlx_nursery", "make-model", str(path), "--preset", "tiny"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return path


def machine() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "src"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": commit.stdout.strip(),
        "src_modified": bool(dirty.stdout.strip()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


# -- fuzz ------------------------------------------------------------------------------------
_NUMBERS = re.compile(r"\d+|req_[0-9a-f]+|resp_[0-9a-f]+|0x[0-9a-f]+")


def signature(outcome: Outcome, kind: str, detail: str) -> str:
    """What makes two failures the same: kind, endpoint, status, error code, the detail's gist."""
    gist = _NUMBERS.sub("N", detail.split("b'", 1)[0] if kind in ("5xx", "rejected") else detail)[
        :80
    ]
    case = outcome.case
    return (
        f"{kind} | {case.endpoint} {case.method} | {outcome.status} {outcome.error_code} | {gist}"
    )


_FRAME = re.compile(r'File "[^"]*/(src/mlx_nursery/[^"]+)", line (\d+), in (\w+)')


def origins(log: str) -> dict[str, str]:
    """request id -> where its internal error was raised (innermost frame in src/, exception)."""
    found: dict[str, str] = {}
    for match in re.finditer(
        r"request (req_[0-9a-f]+) failed with an internal error\n"
        r"(Traceback.*?)(?=\n\S.*?(?:\n|$)|\Z)",
        log,
        re.DOTALL,
    ):
        trace = match.group(2)
        frames = _FRAME.findall(trace)
        last_line = [ln for ln in trace.strip().splitlines() if ln and not ln.startswith(" ")][-1:]
        where = f"{frames[-1][0]}:{frames[-1][1]} {frames[-1][2]}" if frames else "?"
        found[match.group(1)] = f"{where}: {last_line[0][:160] if last_line else '?'}"
    return found


class Recorder:
    def __init__(self) -> None:
        self.cases = 0
        self.by_flavour: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.problems: collections.Counter[str] = collections.Counter()
        self.failures: dict[str, dict[str, Any]] = {}
        self.streams = 0
        self.non_2xx = 0
        self.envelopes = 0
        self.deaths = 0
        self.slowest: list[tuple[float, str]] = []

    def add(self, outcome: Outcome, flavour: str) -> None:
        self.cases += 1
        self.by_flavour[flavour] += 1
        self.statuses[f"{flavour} {outcome.status}"] += 1
        self.streams += outcome.case.stream
        if outcome.status is not None and outcome.status >= 300:
            self.non_2xx += 1
            self.envelopes += not outcome.of("envelope")
        if outcome.health != 200:
            self.deaths += 1
        self.slowest = sorted(
            [*self.slowest, (outcome.elapsed, outcome.case.describe(160))], reverse=True
        )[:5]
        for kind, detail in outcome.problems:
            self.problems[kind] += 1
            key = signature(outcome, kind, detail)
            size = len(outcome.case.describe(10**9))
            entry = self.failures.setdefault(key, {"count": 0, "size": None})
            entry["count"] += 1
            if entry["size"] is None or size < entry["size"]:
                entry.update(
                    size=size,
                    example=outcome.case.describe(1500),
                    detail=detail,
                    request_id=outcome.request_id,
                )


def _driver(run_one: Callable[[Case, str], None], flavour: str) -> Callable[[Case], None]:
    def drive(case: Case) -> None:
        run_one(case, flavour)

    return drive


class HealthProbe:
    """Polls /health on a connection of its own while the cases run, one at a time: a case whose
    preparation blocks the server shows as a slow probe. Keeps the slowest probes and the case
    that was running."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.base_url = ""
        self.current = ""
        self.slowest: list[tuple[float, str]] = []
        self.probes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-probe", daemon=True)

    def start(self, base_url: str) -> None:
        self.base_url = base_url
        self._thread.start()

    def _run(self) -> None:
        client: httpx.Client | None = None
        while not self._stop.wait(self.interval):
            base, case = self.base_url, self.current
            if client is None or client.base_url != httpx.URL(base):
                client = httpx.Client(base_url=base, timeout=120)
            start = time.perf_counter()
            try:
                client.get("/health")
            except httpx.HTTPError:
                client = None  # a restart: the next probe opens a new connection
                continue
            took = time.perf_counter() - start
            self.probes += 1
            if len(self.slowest) < 5 or took > self.slowest[-1][0]:
                self.slowest = sorted([*self.slowest, (took, case)], reverse=True)[:5]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def fuzz(args: argparse.Namespace) -> dict[str, Any]:
    from hypothesis import HealthCheck, Phase, given, settings

    at_start = machine()  # the commit the server runs
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-"))
    log = scratch / "server.log"
    server = Server(
        model_dir(args.model, scratch),
        log,
        "--request-timeout",
        "20",
        "--max-concurrency",
        "4",
        "--default-max-tokens",
        "16",
        "--log-level",
        "warning",
    )  # as tests/http/test_fuzz.py
    server.start()
    target = Target(server.base_url)
    record = Recorder()
    started = time.monotonic()
    strategies = {
        "valid": valid_case(),
        "almost": almost_valid_case(),
        "hostile": hostile_case(args.max_bytes),
    }
    probe = HealthProbe()
    probe.start(server.base_url)

    def run_one(case: Case, flavour: str) -> None:
        nonlocal target
        probe.current = case.describe(160)
        try:
            outcome = target.run(case)
        except Exception as exc:  # noqa: BLE001 - a case this client cannot send: count it, go on
            outcome = Outcome(case)
            outcome.add("unsent", f"{type(exc).__name__}: {exc}")
            outcome.health = target.health()
        record.add(outcome, flavour)
        if outcome.health != 200:  # an engine death: count it, then go on with a fresh server
            print(f"  engine death after: {outcome.report()[:400]}", flush=True)
            target.close()
            server.restart()
            target = Target(server.base_url)
            probe.base_url = server.base_url
        if record.cases % 500 == 0:
            print(
                f"  {record.cases} cases, {time.monotonic() - started:.0f} s,"
                f" problems {dict(record.problems)}",
                flush=True,
            )
            if args.json:
                Path(args.json).write_text(
                    json.dumps(summary(), indent=2, ensure_ascii=False) + "\n"
                )

    def summary(exit_status: int | None = None) -> dict[str, Any]:
        where = origins(log.read_text(errors="replace"))
        failures = [
            {
                "signature": key,
                "count": entry["count"],
                "smallest": entry["example"],
                "detail": entry["detail"],
                "origin": where.get(entry["request_id"] or ""),
            }
            for key, entry in sorted(record.failures.items(), key=lambda kv: -kv[1]["count"])
        ]
        return {
            "machine": at_start,
            "command": " ".join(sys.argv),
            "wall_s": round(time.monotonic() - started, 1),
            "cases": record.cases,
            "by_flavour": dict(record.by_flavour),
            "streams": record.streams,
            "statuses": dict(sorted(record.statuses.items())),
            "problems": dict(record.problems),
            "non_2xx": record.non_2xx,
            "envelopes": record.envelopes,
            "envelope_share": round(record.envelopes / record.non_2xx, 4)
            if record.non_2xx
            else None,
            "engine_deaths": record.deaths,
            "server_starts": server.starts,
            "server_exit": exit_status,
            "slowest_cases": [{"s": round(s, 2), "case": c} for s, c in record.slowest],
            "health_probes": probe.probes,
            "slowest_health_probes": [{"s": round(s, 3), "during": c} for s, c in probe.slowest],
            "failures": failures,
            "server_log": str(log),
        }

    for flavour, share in FLAVOURS.items():
        count = round(args.cases * share)
        config = settings(
            max_examples=count,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
            derandomize=args.seed is None,
        )

        drive = config(given(case=strategies[flavour])(_driver(run_one, flavour)))
        if args.seed is not None:
            from hypothesis import seed

            drive = seed(args.seed)(drive)
        drive()
    probe.stop()
    target.close()
    exit_status = server.stop()
    return summary(exit_status)


# -- soak ------------------------------------------------------------------------------------
PROMPT_WORDS = [
    "the",
    "lighthouse",
    "keeper",
    "watched",
    "sea",
    "while",
    "ships",
    "came",
    "and",
    "went",
    "in",
    "long",
    "night",
    "storm",
    "grew",
    "stronger",
    "over",
    "harbour",
]


def soak_request(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """One request of the mix: an endpoint, a prompt of a few to a few thousand tokens, sampling."""
    words = rng.choices(
        [rng.randint(1, 20), rng.randint(50, 300), rng.randint(400, 1000)],  # <= ~2800 tokens
        weights=[0.45, 0.4, 0.15],
    )[0]
    prompt = " ".join(rng.choice(PROMPT_WORDS) for _ in range(words))
    sampling: dict[str, Any] = {"temperature": rng.choice([0.0, 0.7, 1.0, 1.3])}
    if rng.random() < 0.5:
        sampling["seed"] = rng.randint(-(2**63), 2**63 - 1)
    if rng.random() < 0.3:
        sampling["top_p"] = rng.choice([0.5, 0.9])
    stream = rng.random() < 0.5
    budget = rng.randint(1, 48)
    endpoint = rng.choice(["chat", "completions", "responses"])
    if endpoint == "chat":
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": budget,
            "stream": stream,
            **sampling,
        }
    elif endpoint == "completions":
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": budget,
            "stream": stream,
            **sampling,
        }
    else:
        sampling.pop("seed", None)
        body = {
            "model": MODEL,
            "input": prompt,
            "max_output_tokens": budget,
            "stream": stream,
            "store": rng.random() < 0.5,
            **sampling,
        }
    return endpoint, body


async def one_soak_request(
    base: str,
    rng: random.Random,
    tally: collections.Counter[str],
    judge: Judge,
    failures: list[str],
) -> None:
    endpoint, body = soak_request(rng)
    case = Case("valid", endpoint, body)
    behaviour = rng.choices(["complete", "disconnect", "short_timeout"], weights=[0.6, 0.3, 0.1])[0]
    tally[f"behaviour {behaviour}"] += 1
    timeout = httpx.Timeout(
        rng.uniform(0.05, 0.5) if behaviour == "short_timeout" else 120.0, connect=30.0
    )
    leave_after = rng.uniform(0.0, 0.4)  # seconds, for a disconnect
    leave_at_event = rng.randint(0, 6)  # events, for a disconnect from a stream
    async with httpx.AsyncClient(base_url=base, timeout=timeout) as http:  # its own connection
        try:
            with trio.move_on_after(
                leave_after if behaviour == "disconnect" else math.inf
            ) as scope:
                async with http.stream("POST", case.url, json=body) as reply:
                    raw = b""
                    async for chunk in reply.aiter_raw():
                        raw += chunk
                        if (
                            behaviour == "disconnect"
                            and body["stream"]
                            and raw.count(b"\n\n") >= leave_at_event
                        ):
                            tally["left mid-stream"] += 1
                            return  # leaving the client's block drops the connection
                    outcome = Outcome(case)
                    judge.judge(outcome, reply, raw)
                    tally[f"status {reply.status_code}"] += 1
                    if outcome.problems:
                        tally["failed"] += 1
                        failures.append(
                            f"{outcome.status} {outcome.problems}: {outcome.case.describe(200)}"
                        )
            if scope.cancelled_caught:
                tally["left at a random moment"] += 1
        except httpx.TimeoutException:
            tally["client timed out"] += 1
        except httpx.HTTPError as exc:
            tally[f"transport {type(exc).__name__}"] += 1
            if behaviour == "complete":
                failures.append(f"{endpoint}: {type(exc).__name__}: {exc}")


async def soak_load(
    base: str,
    requests: int,
    concurrency: int,
    seed: int,
    tally: collections.Counter[str],
    failures: list[str],
) -> None:
    rng = random.Random(seed)
    judge = Judge()
    remaining = [requests]

    async def worker(worker_seed: int) -> None:
        own = random.Random(worker_seed)
        while remaining[0] > 0:
            remaining[0] -= 1
            await one_soak_request(base, own, tally, judge, failures)

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker, rng.randrange(2**32))


async def ttft(base: str, samples: int) -> float:
    """Median time to the first content of a short greedy stream, one at a time."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write about the sea. " * 20}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    times = []
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        for _ in range(samples):
            start, first = time.perf_counter(), None
            async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
                async for line in reply.aiter_lines():  # read to the end: the connection is reused
                    compact = line.replace(" ", "")
                    if first is None and '"content":"' in compact and '"content":""' not in compact:
                        first = time.perf_counter() - start
            assert first is not None, "a stream without content"
            times.append(first)
    return statistics.median(times)


def wait_idle(
    pid: int, limit: float = 30.0, window: float = 0.1, busy: float = 0.05
) -> tuple[float, float]:
    """Seconds until a `window` in which the process used less than `busy` of a core, and the
    CPU seconds it used in the first second."""
    start = time.monotonic()
    first_second_from = cpu_seconds(pid)
    first_second: float | None = None
    idle_at: float | None = None
    while time.monotonic() - start < limit:
        before = cpu_seconds(pid)
        time.sleep(window)
        used = cpu_seconds(pid) - before
        if first_second is None and time.monotonic() - start >= 1.0:
            first_second = cpu_seconds(pid) - first_second_from
        if idle_at is None and used < busy * window:
            idle_at = time.monotonic() - start - window
        if idle_at is not None and first_second is not None:
            break
    return (
        idle_at if idle_at is not None else float("inf"),
        first_second if first_second is not None else float("nan"),
    )


def wait_back(pid: int, key: str, baseline: int, limit: float) -> tuple[int, float]:
    """Poll /proc until `key` is back to `baseline` (at most `limit` s): (last value, seconds)."""
    start = time.monotonic()
    while True:
        value = proc_status(pid)[key]
        if value <= baseline or time.monotonic() - start > limit:
            return value, time.monotonic() - start
        time.sleep(0.2)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    at_start = machine()  # the commit the server runs
    scratch = Path(tempfile.mkdtemp(prefix="soak-"))
    log = scratch / "server.log"
    # The bounded caches (prefix cache: 64 entries; stored responses: --responses-max) fill up
    # during the warm-up, so that RSS growth after it counts what leaks, not what is kept.
    server = Server(
        model_dir(args.model, scratch),
        log,
        "--log-level",
        "warning",
        "--responses-max",
        "100",
        *args.server_args,
    )
    server.start()
    base, pid = server.base_url, server.pid
    tally: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    warm: collections.Counter[str] = collections.Counter()
    trio.run(soak_load, base, args.warmup, args.concurrency, args.seed + 1, warm, [])
    wait_idle(pid)
    ttft_before = trio.run(ttft, base, args.ttft_samples)
    time.sleep(11)  # Trio's idle worker threads leave after 10 s: the baseline without them
    before = proc_status(pid)
    mlx_before = mlx_memory_mb(base)
    peak_rss = before["rss"]
    started = time.monotonic()

    async def load_and_watch() -> None:
        nonlocal peak_rss
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal peak_rss
                while True:
                    peak_rss = max(peak_rss, proc_status(pid)["rss"])
                    await trio.sleep(0.5)

            nursery.start_soon(watch)
            for round_ in range(args.rounds):
                share = args.requests // args.rounds + (round_ < args.requests % args.rounds)
                await soak_load(
                    base, share, args.concurrency, args.seed + 100 * round_, tally, failures
                )
                # RSS at each round's end, once idle: a leak grows round after round, a bounded
                # cache that was still filling does not.
                await trio.to_thread.run_sync(wait_idle, pid)
                rounds.append(round(proc_status(pid)["rss"] / 2**20, 1))
                mlx_rounds.append(await trio.to_thread.run_sync(mlx_memory_mb, base))
            nursery.cancel_scope.cancel()

    rounds: list[float] = []
    mlx_rounds: list[dict[str, float]] = []
    trio.run(load_and_watch)
    wall = time.monotonic() - started
    idle_after, cpu_first_second = wait_idle(pid)
    health = httpx.get(base + "/health", timeout=30).status_code
    ttft_after = trio.run(ttft, base, args.ttft_samples)
    threads, threads_s = wait_back(pid, "threads", before["threads"], 30)
    fds, fds_s = wait_back(pid, "fds", before["fds"], 30)
    after = proc_status(pid)
    mlx_after = mlx_memory_mb(base)
    exit_status = server.stop()
    statuses = {k: v for k, v in tally.items() if v}
    five_xx = sum(
        v
        for k, v in statuses.items()
        if k.startswith("status 5") and k not in ("status 503", "status 504")
    )
    return {
        "machine": at_start,
        "command": " ".join(sys.argv),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "wall_s": round(wall, 1),
        "outcomes": dict(sorted(statuses.items())),
        "5xx_other_than_503_504": five_xx,
        "failures": failures[:20],
        "failure_count": len(failures),
        "threads": {
            "before": before["threads"],
            "after": threads,
            "seconds_to_return": round(threads_s, 1),
        },
        "fds": {"before": before["fds"], "after": fds, "seconds_to_return": round(fds_s, 1)},
        "rss_mb": {
            "before": round(before["rss"] / 2**20, 1),
            "peak": round(peak_rss / 2**20, 1),
            "after": round(after["rss"] / 2**20, 1),
            "growth_pct": round(100 * (after["rss"] - before["rss"]) / before["rss"], 2),
            "after_each_round": rounds,
            "growth_after_first_round_pct": round(
                100 * (after["rss"] / 2**20 - rounds[0]) / rounds[0], 2
            ),
        },
        "mlx_memory_mb": {"before": mlx_before, "after_each_round": mlx_rounds, "after": mlx_after},
        "cpu_after_load": {
            "seconds_to_idle": round(idle_after, 2),
            "cpu_s_in_first_second": round(cpu_first_second, 3),
        },
        "ttft_ms": {"before": round(ttft_before * 1000, 1), "after": round(ttft_after * 1000, 1)},
        "health_after": health,
        "server_exit": exit_status,
        "server_log": str(log),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fuzz")
    f.add_argument("--cases", type=int, default=10_000)
    f.add_argument(
        "--max-bytes",
        type=int,
        default=9_000_000,
        help="largest generated string or body (past the server's 8 MiB body limit)",
    )
    f.add_argument("--seed", type=int, default=None, help="Hypothesis seed; default: derandomized")
    s = sub.add_parser("soak")
    s.add_argument("--requests", type=int, default=10_000)
    s.add_argument("--concurrency", type=int, default=16)
    s.add_argument("--rounds", type=int, default=4, help="RSS is read after each round, once idle")
    s.add_argument("--warmup", type=int, default=400)
    s.add_argument("--ttft-samples", type=int, default=15)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--server-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="passed on to mlx-nursery serve (last on the line)",
    )
    for p in (f, s):
        p.add_argument(
            "--model", default=None, help="an mlx-lm directory; default: a fresh tiny model"
        )
        p.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()
    result = fuzz(args) if args.command == "fuzz" else soak(args)
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
