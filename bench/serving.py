"""Serving benchmark: a load generator for any OpenAI-compatible server, as `vllm bench serve`.

Streams chat completions (`stream_options.include_usage`) and measures, per server:
  requests/s and output tok/s over the run's wall time; TTFT (request sent -> first content
  chunk); TPOT = (E2E - TTFT) / (output tokens - 1); ITL = the gaps between content chunks
  (one chunk may carry several tokens); E2E (request sent -> last data event); p50/p90/p99 of
  each; and goodput: requests/s meeting every SLO given (`--goodput ttft:500 tpot:50`, ms;
  a one-token reply's TPOT counts as 0), as vLLM's `vllm bench serve` defines them.
Output token counts come from the server's usage; a server that omits it is counted by
content chunks (the JSON says which was used). Where `nvidia-smi` runs, the GPU's busy share
(its utilization, sampled every 0.5 s) is reported per run over the load's own window, from
the first request sent to the last one ended (`gpu_busy_pct`; `_gpu_busy.py`): a server on
the same machine's GPU, or `--url` on this host.

Load: closed loop (`--clients N`, each sends its next request when the last one ends) or open
loop (`--rate R`: Poisson arrivals at R requests/s, `--max-concurrency` optionally caps the
requests in flight); the run ends after `--num-requests` or `--duration` seconds (in-flight
requests finish). Prompts: `--input-len 128` or a uniform range `64:256` tokens, built from
words and cut to the exact length with the model's tokenizer, with `--prefix-len N` a system
message of N tokens shared by every request before them (an agent's long system prompt, as
`vllm bench serve`'s random dataset's prefix); or `--dataset FILE.jsonl` of conversations.
Outputs: `--output-len` as `max_tokens` (fixed or a range); OpenAI has no ignore_eos, so actual
lengths are reported, and `--ignore-eos` sends `logit_bias` -100 on the model's EOS ids. Sampling:
`--mix greedy:1,temperature:2,seeded:1,json_schema:1` (weights; mlx_lm.server 0.32.2 ignores
`response_format` and runs a request with a `seed` unbatched).
Request i is the same for every server (seeded by `--seed` and i). A vision model's load:
`--images N` puts N images (`--image-size 448x448`, JPEG noise, different for every request)
before each generated prompt's text, as data URLs; with `--image-clients K` (closed loop) only the
first K clients send images and the others text alone (a mixed load), and the metrics are
also reported per class (`by_class`: image, text).

Servers: `--server ours` (mlx-nursery serve), `--server mlx_lm` (mlx_lm.server) and
`--server mlx_vlm` (mlx-vlm's server, for vision models) are started
here on free ports, waited for (/health), warmed up (`--warmup` requests) and stopped (SIGINT
to the process group, then SIGTERM, then SIGKILL), even when the run fails; `--url URL` measures a
server already running. Several run back to back; `--rounds R` interleaves them (the order
reversed every other round) and pools their requests. Without `--model`, the tiny preset is
made in a temporary directory. `--out` is written after every run (`"complete": false` until
the last), so a run cut short keeps what it measured.

Usage:
  python bench/serving.py --server ours --server mlx_lm --clients 8 --duration 60 \
      --mix temperature --temperature 0.7 --ignore-eos --out bench/results/serving.json
  python bench/serving.py --url http://127.0.0.1:8000 --model DIR --rate 4 --num-requests 200 \
      --goodput ttft:500 tpot:50
  python bench/serving.py --server ours --dataset conversations.jsonl --clients 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import httpx
import numpy as np
import trio

sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing
from _gpu_busy import sample_gpu_busy

ROOT = Path(__file__).resolve().parent.parent
PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft", "tpot", "e2el")
MIX_KINDS = ("greedy", "temperature", "seeded", "json_schema")
CONNECT_RETRIES = 10
STOP_GRACE_S = 20.0
_WORD_LIST = (
    "the sea light keeper night storm ship harbor wave wind stone tower lamp rope salt island "
    "morning shore river bird cloud rain door window story old young long short bright dark "
    "cold warm quiet loud north south west east small great water fire earth iron glass paper "
    "bread letter garden road bridge field winter summer voice song silver golden green blue"
)
WORDS = _WORD_LIST.split()
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "count", "tags"],
    "additionalProperties": False,
}


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


# ---------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Lengths:
    """A token count: fixed (`128`) or drawn uniformly from a range (`64:256`, inclusive)."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> Lengths:
        low, _, high = text.partition(":")
        lengths = cls(int(low), int(high or low))
        if not 1 <= lengths.low <= lengths.high:
            raise argparse.ArgumentTypeError(f"bad length {text!r}: want N or LOW:HIGH, 1 <= LOW")
        return lengths

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


def parse_mix(text: str) -> list[tuple[str, float]]:
    """`greedy:1,temperature:3` -> [("greedy", 1.0), ("temperature", 3.0)]; weight 1 if none."""
    mix = []
    for item in text.split(","):
        kind, _, weight = item.strip().partition(":")
        if kind not in MIX_KINDS:
            raise argparse.ArgumentTypeError(f"unknown sampling kind {kind!r}: one of {MIX_KINDS}")
        mix.append((kind, float(weight or 1)))
    if not any(weight > 0 for _, weight in mix):
        raise argparse.ArgumentTypeError("the sampling mix needs a positive weight")
    return mix


def sampling_fields(kind: str, temperature: float, rng: random.Random) -> dict[str, Any]:
    """The request fields of one sampling kind."""
    if kind == "greedy":
        return {"temperature": 0.0}
    fields: dict[str, Any] = {"temperature": temperature}
    if kind == "seeded":
        fields["seed"] = rng.randrange(2**31)
    elif kind == "json_schema":
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "item", "schema": JSON_SCHEMA, "strict": True},
        }
    return fields


class PromptMaker:
    """Prompt texts of an exact token count (without the chat template's tokens).

    Random words are tokenized, cut to `n` ids and decoded; the text is re-encoded to check
    the count. Without a tokenizer, one word stands for one token (the JSON says so)."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int | None:
        if self.tokenizer is None:
            return None
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def text(self, n: int, rng: random.Random) -> str:
        words = [rng.choice(WORDS) for _ in range(n + 8)]
        if self.tokenizer is None:
            return " ".join(words[:n])
        ids = self.tokenizer.encode(" ".join(words), add_special_tokens=False)
        while len(ids) < n:  # every word is at least one token: never loops more than once
            words += [rng.choice(WORDS) for _ in range(n)]
            ids = self.tokenizer.encode(" ".join(words), add_special_tokens=False)
        text = self.tokenizer.decode(ids[:n])
        for _ in range(4):  # a cut can re-merge differently; trim or pad until it settles
            count = len(ids := self.tokenizer.encode(text, add_special_tokens=False))
            if count == n:
                break
            text = self.tokenizer.decode(ids[:n]) if count > n else f"{text} {rng.choice(WORDS)}"
        return text


@dataclass(frozen=True)
class Conversation:
    """Messages to send, and the reference reply's length in tokens (None if not known)."""

    messages: list[dict[str, str]]
    output_tokens: int | None


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
_ROLES |= {"system": "system", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}


def load_conversations(path: Path, count: Callable[[str], int | None]) -> list[Conversation]:
    """Read a JSONL file of conversations, one per line, in any of three forms:

    `{"messages": [{"role", "content"}, ...]}` (OpenAI), `{"conversations": [{"from",
    "value"}, ...]}` (ShareGPT) or `{"prompt": "..."}`. A final assistant turn is the reference
    reply: it is not sent, its token count becomes the request's max_tokens. A line's
    `max_tokens` overrides that. Blank lines are skipped; a bad line raises ValueError."""
    conversations = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if "messages" in record:
                messages = [
                    {"role": m["role"], "content": m["content"]} for m in record["messages"]
                ]
            elif "conversations" in record:
                messages = [
                    {"role": _ROLES[turn["from"]], "content": turn["value"]}
                    for turn in record["conversations"]
                ]
            else:
                messages = [{"role": "user", "content": record["prompt"]}]
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}:{number}: not a conversation ({exc!r})") from exc
        output = None
        if len(messages) > 1 and messages[-1]["role"] == "assistant":
            output = count(messages.pop()["content"])
        if not messages or messages[-1]["role"] == "assistant":
            raise ValueError(f"{path}:{number}: nothing to send")
        if isinstance(record.get("max_tokens"), int):
            output = record["max_tokens"]
        conversations.append(Conversation(messages, output))
    if not conversations:
        raise ValueError(f"{path}: no conversations")
    return conversations


@dataclass(frozen=True)
class RequestSpec:
    index: int
    messages: list[dict[str, Any]]
    prompt_tokens: int | None  # of the messages' text, by the tokenizer (None: no tokenizer)
    max_tokens: int
    kind: str
    fields: dict[str, Any]
    images: int = 0  # images before the text


@dataclass(frozen=True)
class Workload:
    prompts: PromptMaker
    input_len: Lengths
    output_len: Lengths
    mix: list[tuple[str, float]]
    temperature: float
    seed: int
    conversations: list[Conversation] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # sent with every request
    images: int = 0
    """Images before the text of each generated prompt (a vision model's load)."""
    image_size: tuple[int, int] = (448, 448)
    prefix: str | None = None
    """A system message sent before each generated prompt (`--prefix-len`)."""
    prefix_tokens: int | None = None

    def request(self, index: int, tag: str = "run", images: bool = True) -> RequestSpec:
        """Request `index`: the same for every server and round. `images=False`: text alone
        (a text client of a mixed load), whatever `self.images` says."""
        rng = random.Random(f"{self.seed}:{tag}:{index}")
        kinds, weights = zip(*self.mix, strict=True)
        kind = rng.choices(kinds, weights)[0]
        max_tokens = self.output_len.draw(rng)
        sent_images = 0
        if self.conversations:
            conversation = self.conversations[index % len(self.conversations)]
            messages = conversation.messages
            max_tokens = conversation.output_tokens or max_tokens
            counts = [self.prompts.count(m["content"]) for m in messages]
            prompt_tokens = None if None in counts else sum(c or 0 for c in counts)
        else:
            prompt_tokens = self.input_len.draw(rng)
            text = self.prompts.text(prompt_tokens, rng)
            prompt_tokens = self.prompts.count(text)
            content: Any = text
            if images and self.images:
                parts = [image_part(rng, self.image_size) for _ in range(self.images)]
                content = [*parts, {"type": "text", "text": text}]
                sent_images = self.images
            messages = [{"role": "user", "content": content}]
            if self.prefix is not None:
                messages.insert(0, {"role": "system", "content": self.prefix})
                prompt_tokens = sum_known(prompt_tokens, self.prefix_tokens)
        fields = {**sampling_fields(kind, self.temperature, rng), **self.extra}
        return RequestSpec(index, messages, prompt_tokens, max_tokens, kind, fields, sent_images)


def sum_known(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def image_part(rng: random.Random, size: tuple[int, int]) -> dict[str, Any]:
    """A chat image part: a JPEG of noise drawn from `rng` (so request i's images are the
    same for every server, and differ from every other request's), as a data URL."""
    import base64
    import io

    from PIL import Image

    noise = np.random.default_rng(rng.getrandbits(64)).integers(
        0, 256, (size[1], size[0], 3), dtype=np.uint8
    )
    out = io.BytesIO()
    Image.fromarray(noise).save(out, format="JPEG", quality=90)
    url = "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


# ---------------------------------------------------------------------------- one request


@dataclass
class Record:
    """What one request measured. Times in seconds; `start` from the run's start."""

    index: int
    kind: str
    max_tokens: int
    requested_prompt_tokens: int | None
    images: int = 0
    start: float = 0.0
    error: str | None = None
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    output_tokens: int = 0
    tokens_from: str = "chunks"
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    retries: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None and self.latency is not None

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1); None for a reply of one token."""
        if not self.ok or self.output_tokens < 2:
            return None
        assert self.latency is not None and self.ttft is not None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def request_body(model: str, spec: RequestSpec) -> dict[str, Any]:
    return {
        "model": model,
        "messages": spec.messages,
        "max_tokens": spec.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **spec.fields,
    }


async def _read_stream(response: httpx.Response, record: Record, sent: float) -> None:
    last = sent
    usage: dict[str, Any] | None = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, SSE comments (mlx_lm.server's keepalives)
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        now = time.perf_counter()
        if chunk.get("error"):
            record.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
            return
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            record.finish_reason = choice.get("finish_reason") or record.finish_reason
            if (choice.get("delta") or {}).get("content"):
                if record.ttft is None:
                    record.ttft = now - sent
                else:
                    record.itl.append(now - last)
                record.chunks += 1
                last = now
        record.latency = now - sent
    if record.ttft is None:
        record.error = "the stream carried no content"
    if usage and isinstance(usage.get("completion_tokens"), int):
        record.output_tokens, record.tokens_from = usage["completion_tokens"], "usage"
        record.prompt_tokens = usage.get("prompt_tokens")
    else:
        record.output_tokens = record.chunks


async def send_request(
    http: httpx.AsyncClient, model: str, spec: RequestSpec, origin: float
) -> Record:
    """Stream one chat completion. A connection refused or reset before any byte is retried
    (as the SDKs do: mlx_lm.server's stdlib listener resets bursts); timing starts at the first
    attempt. Other failures end up in `record.error`."""
    record = Record(spec.index, spec.kind, spec.max_tokens, spec.prompt_tokens, spec.images)
    body = request_body(model, spec)
    sent = time.perf_counter()
    record.start = sent - origin
    for attempt in range(CONNECT_RETRIES + 1):
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    record.error = f"HTTP {response.status_code}: {text[:300]}"
                    return record
                await _read_stream(response, record, sent)
                return record
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError) as exc:
            if record.chunks or attempt == CONNECT_RETRIES:
                record.error = f"{type(exc).__name__}: {exc}"
                return record
            record.retries += 1
            await trio.sleep(0.05 * (attempt + 1))
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            return record
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------- load patterns

Send = Callable[[RequestSpec], Awaitable[Record]]


@dataclass(frozen=True)
class Load:
    clients: int | None  # closed loop
    rate: float | None  # open loop, requests/s (Poisson)
    max_concurrency: int | None  # open loop cap on requests in flight
    num_requests: int | None
    duration: float | None
    image_clients: int | None = None  # closed loop: only the first K clients send images

    def more(self, index: int, elapsed: float) -> bool:
        if self.num_requests is not None and index >= self.num_requests:
            return False
        return self.duration is None or elapsed < self.duration


async def run_load(send: Send, workload: Workload, load: Load, seed: int) -> float:
    """Run the load; the records are what `send` keeps. Returns the wall time in seconds,
    from the first request sent to the last one ended."""
    start = time.perf_counter()
    next_index = 0
    async with trio.open_nursery() as nursery:
        if load.rate is None:

            async def client(images: bool) -> None:
                nonlocal next_index
                while load.more(next_index, time.perf_counter() - start):
                    next_index += 1
                    await send(workload.request(next_index - 1, images=images))

            for number in range(load.clients or 1):
                images = load.image_clients is None or number < load.image_clients
                nursery.start_soon(client, images)
        else:
            arrivals = random.Random(f"{seed}:arrivals")
            limit = trio.Semaphore(load.max_concurrency or 10**9)

            async def one(spec: RequestSpec) -> None:
                async with limit:
                    await send(spec)

            arrival = start
            while load.more(next_index, arrival - start):
                await trio.sleep_until(trio.current_time() + arrival - time.perf_counter())
                nursery.start_soon(one, workload.request(next_index))
                next_index += 1
                arrival += arrivals.expovariate(load.rate)
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- metrics


def parse_slo(items: Sequence[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slo = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in SLO_KEYS or not value:
            raise argparse.ArgumentTypeError(f"bad SLO {item!r}: KEY:MS with KEY in {SLO_KEYS}")
        slo[key] = float(value)
        if slo[key] <= 0:
            raise argparse.ArgumentTypeError(f"bad SLO {item!r}: the limit must be positive")
    return slo


def meets_slo(record: Record, slo: dict[str, float]) -> bool:
    """Every SLO given holds (ms); a one-token reply's TPOT counts as 0, as in vLLM."""
    if not record.ok:
        return False
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.latency}
    return all((values[key] or 0.0) * 1000 <= limit for key, limit in slo.items())


def distribution(values_s: Sequence[float]) -> dict[str, float | None]:
    """Mean and percentiles in milliseconds (numpy's linear interpolation, as vLLM)."""
    if not values_s:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ms = np.asarray(values_s) * 1000
    return {"mean": float(ms.mean()), **{f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES}}


def compute_metrics(
    records: Sequence[Record], duration: float, slo: dict[str, float]
) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    output = sum(r.output_tokens for r in ok)
    sources = {r.tokens_from for r in ok}
    return {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration,
        "output_tokens": output,
        "output_tokens_from": sources.pop() if len(sources) == 1 else sorted(sources) or None,
        "requests_per_s": len(ok) / duration,
        "output_tokens_per_s": output / duration,
        "goodput_requests_per_s": (sum(meets_slo(r, slo) for r in ok) / duration if slo else None),
        "slo_ms": slo,
        "ttft_ms": distribution([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": distribution([t for r in ok if (t := r.tpot) is not None]),
        "itl_ms": distribution([gap for r in ok for gap in r.itl]),
        "e2el_ms": distribution([r.latency for r in ok if r.latency is not None]),
    }


def metrics_by_class(
    records: Sequence[Record], duration: float, slo: dict[str, float]
) -> dict[str, Any]:
    """The metrics of the requests with images and of those without, each over the whole
    run's wall time (a mixed load's classes); empty unless both classes are present."""
    image = [r for r in records if r.images]
    text = [r for r in records if not r.images]
    if not image or not text:
        return {}
    return {
        "image": compute_metrics(image, duration, slo),
        "text": compute_metrics(text, duration, slo),
    }


def records_summary(records: Sequence[Record]) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    outputs = [r.output_tokens for r in ok]
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    requested = [r.requested_prompt_tokens for r in ok if r.requested_prompt_tokens is not None]
    return {
        "requests": len(records),
        "by_kind": dict(Counter(r.kind for r in records)),
        "finish_reasons": dict(Counter(str(r.finish_reason) for r in ok)),
        "output_tokens": {
            "min": min(outputs, default=None),
            "mean": float(np.mean(outputs)) if outputs else None,
            "max": max(outputs, default=None),
            "at_max_tokens": sum(r.output_tokens >= r.max_tokens for r in ok),
        },
        "chunks_per_request_mean": float(np.mean([r.chunks for r in ok])) if ok else None,
        "prompt_tokens_requested_mean": float(np.mean(requested)) if requested else None,
        "prompt_tokens_server_mean": float(np.mean(prompts)) if prompts else None,
        "connection_retries": sum(r.retries for r in records),
        "errors": Counter(r.error for r in records if r.error).most_common(5),
    }


# ---------------------------------------------------------------------------- servers


@dataclass(frozen=True)
class Target:
    label: str  # "ours", "mlx_lm", "mlx_vlm" or the URL
    url: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(kind: str, model: Path, port: int, concurrency: int, extra: str) -> list[str]:
    bin_dir = Path(sys.executable).parent
    if kind == "ours":
        ours = bin_dir / "mlx-nursery"
        head = [str(ours)] if ours.exists() else [sys.executable, "-m", "mlx_nursery"]
        command = [*head, "serve", "--model", str(model), "--port", str(port)]
        command += ["--max-concurrency", str(concurrency), "--log-level", "warning"]
        command += ["--responses-db", ":memory:"]
    elif kind == "mlx_vlm":
        command = [sys.executable, "-m", "mlx_vlm.server", "--model", str(model)]
        command += ["--port", str(port), "--max-num-seqs", str(concurrency)]
    else:
        command = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model)]
        command += ["--port", str(port), "--decode-concurrency", str(concurrency)]
        command += ["--log-level", "WARNING"]
    return command + shlex.split(extra)


async def wait_ready(
    http: httpx.AsyncClient, process: trio.Process | None, log: Path | None
) -> None:
    """Until /health answers 200 (or, where a server has no /health, /v1/models does)."""
    while True:
        if process is not None and process.returncode is not None:
            tail = (await trio.Path(log).read_text(errors="replace"))[-3000:] if log else ""
            raise RuntimeError(f"the server exited with {process.returncode}:\n{tail}")
        with contextlib.suppress(httpx.TransportError):
            response = await http.get("/health")
            if response.status_code == 404:
                response = await http.get("/v1/models")
            if response.status_code == 200:
                return
        await trio.sleep(0.2)


async def stop_process(process: trio.Process) -> None:
    """SIGINT to the server's process group; SIGTERM after a grace (a process started with
    SIGINT ignored, as from a shell's background job, inherits that); SIGKILL after another;
    then SIGKILL to whatever of the group is left. Shielded: it completes under cancellation."""
    steps = ((signal.SIGINT, 5.0), (signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, math.inf))
    with trio.CancelScope(shield=True):
        for sig, grace in steps:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with trio.move_on_after(grace):
                await process.wait()
                break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Server:
    label: str
    base_url: str
    model_name: str
    command: list[str] | None
    log: str | None
    ready_s: float | None = None
    """Seconds from the process's launch to its first ready answer (None: a --url server)."""


@contextlib.asynccontextmanager
async def open_server(
    target: Target, model: Path | None, args: argparse.Namespace, log_dir: Path
) -> AsyncIterator[Server]:
    """A running server: started (and stopped on exit) unless the target is a URL."""
    if target.url is not None:
        async with httpx.AsyncClient(base_url=target.url, timeout=10) as http:
            with trio.fail_after(args.ready_timeout):
                await wait_ready(http, None, None)
            name = args.served_model or await listed_model(http)
        yield Server(target.label, target.url, name, None, None)
        return
    assert model is not None
    port = free_port()
    extra = {"ours": args.ours_args, "mlx_lm": args.mlx_lm_args, "mlx_vlm": args.mlx_vlm_args}[
        target.label
    ]
    command = server_command(target.label, model, port, args.server_concurrency, extra)
    log = log_dir / f"{target.label}-{port}.log"
    base_url = f"http://127.0.0.1:{port}"
    launched = trio.current_time()
    with log.open("wb") as sink:
        process = await trio.lowlevel.open_process(
            command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
            with trio.fail_after(args.ready_timeout):
                await wait_ready(http, process, log)
            ready_s = round(trio.current_time() - launched, 1)
            # mlx_lm.server's /v1/models lists the HF cache; it answers to its --model path.
            name = await listed_model(http) if target.label == "ours" else str(model)
        yield Server(target.label, base_url, name, command, str(log), ready_s)
    finally:
        await stop_process(process)


async def listed_model(http: httpx.AsyncClient) -> str:
    response = await http.get("/v1/models")
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


# ---------------------------------------------------------------------------- a run


async def warm_up(http: httpx.AsyncClient, server: Server, workload: Workload, n: int) -> None:
    """`n` requests (2 at a time), untimed; a 503 (model still loading) is retried, each
    request within `--request-timeout` (a cold machine's first one can take a minute)."""
    limit = trio.Semaphore(2)

    async def one(index: int) -> None:
        spec = workload.request(index, tag="warmup")
        async with limit:
            with trio.fail_after(http.timeout.read or 600):
                while (record := await send_request(http, server.model_name, spec, 0.0)).error:
                    if not record.error.startswith("HTTP 503"):
                        raise RuntimeError(f"{server.label} warm-up failed: {record.error}")
                    await trio.sleep(0.5)

    async with trio.open_nursery() as nursery:
        for index in range(n):
            nursery.start_soon(one, index)


async def measure(server: Server, workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    in_flight = args.clients or args.max_concurrency or 256
    limits = httpx.Limits(max_connections=in_flight + 8, max_keepalive_connections=in_flight + 8)
    timeout = httpx.Timeout(args.request_timeout, connect=30)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=timeout, limits=limits) as http:
        await warm_up(http, server, workload, args.warmup)
        records: list[Record] = []
        async with sample_gpu_busy() as gpu:
            origin = time.perf_counter()

            async def send(spec: RequestSpec) -> Record:
                records.append(record := await send_request(http, server.model_name, spec, origin))
                return record

            duration = await run_load(send, workload, args.load, args.seed)
    busy = None if gpu is None else gpu.mean(origin, origin + duration)
    return {"duration_s": duration, "records": records, "gpu_busy_pct": busy}


def pooled_gpu_busy(runs: Sequence[dict[str, Any]]) -> float | None:
    """The GPU's busy share over several runs, each weighed by its duration (None: none was
    sampled)."""
    sampled: list[tuple[float, float]] = [
        (float(r["gpu_busy_pct"]), float(r["duration_s"]))
        for r in runs
        if r.get("gpu_busy_pct") is not None
    ]
    total = sum(seconds for _, seconds in sampled)
    if not sampled or total <= 0:
        return None
    return round(sum(busy * seconds for busy, seconds in sampled) / total, 1)


class Terminated(Exception):
    """SIGTERM arrived: the run stops as on Ctrl-C, its servers stopped."""


Checkpoint = Callable[[list[dict[str, Any]]], None]
"""Given the servers' results so far after each run (a run cut short later keeps them)."""


async def run_all(
    targets: list[Target],
    model: Path | None,
    workload: Workload,
    args: argparse.Namespace,
    checkpoint: Checkpoint | None = None,
) -> list[dict[str, Any]]:
    """`run_rounds`, stopped by SIGTERM (Terminated) as by Ctrl-C (KeyboardInterrupt)."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for _ in signals:
                    raise Terminated

            nursery.start_soon(watch)
            rows = await run_rounds(targets, model, workload, args, checkpoint)
            nursery.cancel_scope.cancel()
    return rows


async def run_rounds(
    targets: list[Target],
    model: Path | None,
    workload: Workload,
    args: argparse.Namespace,
    checkpoint: Checkpoint | None = None,
) -> list[dict[str, Any]]:
    """Every target, round by round (the order reversed every other round); `checkpoint`
    gets the results so far after each run."""
    results: dict[str, dict[str, Any]] = {t.label: {"label": t.label, "runs": []} for t in targets}
    with contextlib.ExitStack() as stack:
        if args.log_dir is None:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serving-"))
        else:
            args.log_dir.mkdir(parents=True, exist_ok=True)
            log_dir = str(args.log_dir)
        for round_index in range(args.rounds):
            order = targets if round_index % 2 == 0 else targets[::-1]
            for target in order:
                print(f"round {round_index + 1}/{args.rounds}: {target.label} ...", flush=True)
                async with open_server(target, model, args, Path(log_dir)) as server:
                    run = await measure(server, workload, args)
                result = results[target.label]
                result.update(url=server.base_url, model_name=server.model_name)
                result.update(command=server.command)
                run["ready_s"] = server.ready_s
                result["runs"].append(run)
                if server.ready_s is not None:
                    print(f"  {target.label} ready {server.ready_s} s after its launch", flush=True)
                metrics = compute_metrics(run["records"], run["duration_s"], args.slo)
                print(f"  {format_row(target.label, metrics)}", flush=True)
                if run["gpu_busy_pct"] is not None:
                    print(f"  GPU busy {run['gpu_busy_pct']}% (nvidia-smi, the load's window)")
                by_class = metrics_by_class(run["records"], run["duration_s"], args.slo)
                for name, class_metrics in by_class.items():
                    print(f"  {format_row(f'{target.label} ({name})', class_metrics)}", flush=True)
                if checkpoint is not None:
                    checkpoint(
                        [
                            summarize({**r, "runs": [*r["runs"]]}, args)
                            for r in results.values()
                            if r["runs"]
                        ]
                    )
    return [summarize(result, args) for result in results.values()]


def summarize(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    runs = result.pop("runs")
    records = [r for run in runs for r in run["records"]]
    duration = sum(run["duration_s"] for run in runs)
    result["metrics"] = compute_metrics(records, duration, args.slo)
    if by_class := metrics_by_class(records, duration, args.slo):
        result["by_class"] = by_class
    result["gpu_busy_pct"] = pooled_gpu_busy(runs)
    result["rounds"] = [
        {
            **{
                key: compute_metrics(run["records"], run["duration_s"], args.slo)[key]
                for key in ("completed", "duration_s", "requests_per_s", "output_tokens_per_s")
            },
            "gpu_busy_pct": run.get("gpu_busy_pct"),
            "ready_s": run.get("ready_s"),
        }
        for run in runs
    ]
    result["records_summary"] = records_summary(records)
    if args.save_records:
        result["records"] = [asdict(r) for r in records]
    return result


# ---------------------------------------------------------------------------- output


def _triple(d: dict[str, float | None]) -> str:
    return " / ".join("-" if d[f"p{p}"] is None else f"{d[f'p{p}']:.1f}" for p in PERCENTILES)


HEADER = (
    "| server | ok / failed | req/s | out tok/s | goodput req/s | TTFT ms p50 / p90 / p99 "
    "| TPOT ms p50 / p90 / p99 | ITL ms p50 / p90 / p99 | E2E ms p50 / p90 / p99 |"
)


def format_row(label: str, m: dict[str, Any]) -> str:
    goodput = m["goodput_requests_per_s"]
    cells = [
        label,
        f"{m['completed']} / {m['failed']}",
        f"{m['requests_per_s']:.2f}",
        f"{m['output_tokens_per_s']:.1f}",
        "-" if goodput is None else f"{goodput:.2f}",
        *(_triple(m[key]) for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")),
    ]
    return "| " + " | ".join(cells) + " |"


def ratios(ours: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    out: dict[str, Any] = {
        key: ratio(ours[key], ref[key])
        for key in ("requests_per_s", "output_tokens_per_s", "goodput_requests_per_s")
    }
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        out[key] = {p: ratio(ours[key][p], ref[key][p]) for p in ours[key]}
    return out


def format_ratio_row(r: dict[str, Any], reference: str = "mlx_lm") -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    cells = [f"ours / {reference}", "", f(r["requests_per_s"]), f(r["output_tokens_per_s"])]
    cells.append(f(r["goodput_requests_per_s"]))
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        cells.append(" / ".join(f(r[key][f"p{p}"]) for p in PERCENTILES))
    return "| " + " | ".join(cells) + " |"


def git_commit() -> dict[str, Any]:
    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "-s", "-uno"))}


def machine() -> dict[str, Any]:
    versions = {}
    for package in ("mlx", "mlx-lm", "mlx-nursery", "httpx"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[package] = version(package)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


# ---------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--server", action="append", choices=("ours", "mlx_lm", "mlx_vlm"), default=[])
    p.add_argument("--url", action="append", default=[], help="a server already running")
    p.add_argument("--model", type=Path, help="model directory (default: the tiny preset)")
    p.add_argument("--tokenizer", type=Path, help="tokenizer directory (default: --model)")
    p.add_argument("--served-model", help="the `model` sent to --url servers")
    p.add_argument("--clients", type=int, help="closed loop: clients (default 8)")
    p.add_argument("--rate", type=float, help="open loop: Poisson arrivals, requests/s")
    p.add_argument("--max-concurrency", type=int, help="open loop: requests in flight at most")
    p.add_argument("--num-requests", type=int, help="requests per server per round")
    p.add_argument("--duration", type=float, help="seconds per server per round (default 60)")
    p.add_argument("--input-len", type=Lengths.parse, default=Lengths(128, 128), help="N or A:B")
    p.add_argument("--output-len", type=Lengths.parse, default=Lengths(128, 128))
    p.add_argument(
        "--prefix-len", type=int, help="a system prompt of N tokens shared by every request"
    )
    p.add_argument("--dataset", type=Path, help="JSONL conversations (replaces --input-len)")
    p.add_argument("--mix", type=parse_mix, default=parse_mix("greedy"), help="KIND:WEIGHT,...")
    p.add_argument("--temperature", type=float, default=0.7, help="of the non-greedy kinds")
    p.add_argument("--ignore-eos", action="store_true", help="logit_bias -100 on EOS ids")
    p.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS", help="ttft, tpot, e2el")
    p.add_argument("--warmup", type=int, default=4, help="untimed requests per server start")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-concurrency", type=int, default=8, help="batch width of both")
    p.add_argument("--ours-args", default="", help="more `mlx-nursery serve` flags")
    p.add_argument("--mlx-lm-args", default="", help="more mlx_lm.server flags")
    p.add_argument("--mlx-vlm-args", default="", help="more mlx_vlm.server flags")
    p.add_argument("--images", type=int, default=0, help="images per generated prompt")
    p.add_argument("--image-size", default="448x448", help="WIDTHxHEIGHT of each image")
    p.add_argument(
        "--image-clients", type=int, help="closed loop: only the first K clients send images"
    )
    p.add_argument("--request-timeout", type=float, default=600)
    p.add_argument("--ready-timeout", type=float, default=300)
    p.add_argument("--save-records", action="store_true", help="every request in the JSON")
    p.add_argument("--log-dir", type=Path, help="keep the servers' logs here (default: removed)")
    p.add_argument("--out", type=Path, help="JSON results file")
    args = p.parse_args(argv)
    if not args.server and not args.url:
        p.error("give --server ours/mlx_lm and/or --url")
    if args.rate is not None and args.clients is not None:
        p.error("--clients (closed loop) or --rate (open loop), not both")
    if args.rate is None and args.clients is None:
        args.clients = 8
    if args.num_requests is None and args.duration is None:
        args.duration = 60.0
    if args.prefix_len is not None and (args.dataset or args.prefix_len < 1):
        p.error("--prefix-len: a positive token count, without --dataset")
    if args.image_clients is not None:
        if args.rate is not None or not args.images:
            p.error("--image-clients needs closed-loop --clients and --images")
        if not 0 <= args.image_clients <= args.clients:
            p.error("--image-clients: between 0 and --clients")
    args.slo = parse_slo(args.goodput)
    args.load = Load(
        args.clients,
        args.rate,
        args.max_concurrency,
        args.num_requests,
        args.duration,
        args.image_clients,
    )
    return args


def load_tokenizer(path: Path | None) -> Tokenizer | None:
    if path is None:
        return None
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    return cast("Tokenizer", AutoTokenizer.from_pretrained(str(path)))


def eos_ids(model: Path | None) -> list[int]:
    if model is None:
        raise SystemExit("--ignore-eos needs --model (its config.json names the EOS ids)")
    eos = json.loads((model / "config.json").read_text()).get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


def build_workload(args: argparse.Namespace, model: Path | None) -> Workload:
    prompts = PromptMaker(load_tokenizer(args.tokenizer or model))
    conversations = None
    if args.dataset:
        conversations = load_conversations(args.dataset, prompts.count)
    extra = {}
    if args.ignore_eos:
        extra["logit_bias"] = {str(i): -100 for i in eos_ids(model)}
    prefix = shared_prefix(prompts, args.prefix_len, args.seed)
    return Workload(
        prompts,
        args.input_len,
        args.output_len,
        args.mix,
        args.temperature,
        args.seed,
        conversations,
        extra,
        images=args.images,
        image_size=parse_size(args.image_size),
        prefix=prefix,
        prefix_tokens=None if prefix is None else prompts.count(prefix),
    )


def shared_prefix(prompts: PromptMaker, tokens: int | None, seed: int) -> str | None:
    """The shared system prompt: the same text for every request, server and round."""
    if tokens is None:
        return None
    return prompts.text(tokens, random.Random(f"{seed}:prefix"))


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    return int(width), int(height)


def report(
    args: argparse.Namespace, model: Path | None, workload: Workload, results: list[dict[str, Any]]
) -> dict[str, Any]:
    print(f"\n{HEADER}\n|" + "---|" * 9)
    for result in results:
        print(format_row(result["label"], result["metrics"]))
        for name, metrics in result.get("by_class", {}).items():
            print(format_row(f"{result['label']} ({name})", metrics))
    by_label = {r["label"]: r["metrics"] for r in results}
    ratio = None
    reference = next((k for k in ("mlx_lm", "mlx_vlm") if k in by_label), None)
    if "ours" in by_label and reference is not None:
        ratio = ratios(by_label["ours"], by_label[reference])
        print(format_ratio_row(ratio, reference))
    for result in results:
        if result.get("gpu_busy_pct") is not None:
            print(f"GPU busy beside {result['label']}: {result['gpu_busy_pct']}% (nvidia-smi)")
    settings = {
        key: (str(value) if isinstance(value, Path) else value)
        for key, value in vars(args).items()
        if key not in ("load", "input_len", "output_len", "mix")
    }
    settings |= {"input_len": asdict(args.input_len), "output_len": asdict(args.output_len)}
    settings |= {
        "mix": dict(args.mix),
        "prompt_tokens_by": "tokenizer" if workload.prompts.tokenizer else "words",
    }
    return {
        "tool": "bench/serving.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "git": git_commit(),
        "machine": machine(),
        "model": str(model) if model else None,
        "settings": settings,
        "metric_definitions": __doc__.split("Load:")[0].strip() if __doc__ else None,
        "servers": results,
        "ratios": {"ours/mlx_lm": ratio} if ratio else {},
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    targets = [Target(kind) for kind in dict.fromkeys(args.server)]
    targets += [Target(url, url=url) for url in args.url]
    with tempfile.TemporaryDirectory(prefix="bench-serving-model-") as scratch:
        model = args.model
        if model is None and args.server:
            from mlx_nursery.tools import make_model

            model = make_model(Path(scratch) / "tiny", "tiny", seed=0)
        workload = build_workload(args, model)

        def write(results: list[dict[str, Any]], *, complete: bool) -> None:
            if not args.out:
                return
            document = report(args, args.model, workload, results)
            document["complete"] = complete  # False: the runs so far of a run not finished
            if args.model is None and args.server:
                document["model"] = "the tiny preset (seed 0), made in a temporary directory"
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(document, indent=2) + "\n")

        interrupted = False
        try:
            results = trio.run(
                run_all, targets, model, workload, args, lambda rows: write(rows, complete=False)
            )
        except* (KeyboardInterrupt, Terminated):
            interrupted = True
        if interrupted:
            print("interrupted: the servers started were stopped", file=sys.stderr)
            return 130
        write(results, complete=True)
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        if "mlx_nursery.models" in sys.modules:
            # make_model ran MLX on this thread: MLX needs its streams destroyed before the
            # interpreter shuts down, or the process may abort (ml-explore/mlx#4327).
            from mlx_nursery.models import release_mlx_streams

            release_mlx_streams()
