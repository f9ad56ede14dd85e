"""bench/serving.py: its metrics, SLO goodput, prompt calibration, JSONL loader, stream parsing
and load patterns on synthetic inputs; and one run of the tool against our real server."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import trio
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_serving", ROOT / "bench" / "serving.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


serving = _load_tool()


def record(ttft: float | None, latency: float | None, tokens: int, **kwargs: Any) -> Any:
    gaps = kwargs.pop("itl", [])
    r = serving.Record(index=0, kind="greedy", max_tokens=16, requested_prompt_tokens=8, **kwargs)
    r.ttft, r.latency, r.output_tokens, r.itl, r.tokens_from = ttft, latency, tokens, gaps, "usage"
    return r


SYNTHETIC = [
    record(0.1, 1.0, 10, itl=[0.1] * 9),  # TPOT (1.0 - 0.1) / 9 = 0.1
    record(0.2, 0.8, 4, itl=[0.2] * 3),  # TPOT (0.8 - 0.2) / 3 = 0.2
    record(0.3, 0.3, 1),  # one token: no TPOT
    record(None, None, 0, error="HTTP 503: queue full"),
]


def test_metrics_from_synthetic_timings() -> None:
    m = serving.compute_metrics(SYNTHETIC, 2.0, {})
    assert (m["completed"], m["failed"], m["output_tokens"]) == (3, 1, 15)
    assert m["output_tokens_from"] == "usage"
    assert m["requests_per_s"] == pytest.approx(1.5)
    assert m["output_tokens_per_s"] == pytest.approx(7.5)
    assert m["goodput_requests_per_s"] is None  # no SLO given
    # numpy's linear interpolation, in ms
    assert m["ttft_ms"] == pytest.approx({"mean": 200, "p50": 200, "p90": 280, "p99": 298})
    assert m["tpot_ms"] == pytest.approx({"mean": 150, "p50": 150, "p90": 190, "p99": 199})
    assert m["e2el_ms"]["p50"] == pytest.approx(800)
    # ITL pools every gap of every request: 9 of 100 ms and 3 of 200 ms
    assert m["itl_ms"]["mean"] == pytest.approx(125)
    assert m["itl_ms"]["p50"] == pytest.approx(100)
    assert m["itl_ms"]["p99"] == pytest.approx(200)


def test_metrics_of_a_run_with_no_success() -> None:
    m = serving.compute_metrics(SYNTHETIC[3:], 1.0, {"ttft": 100.0})
    assert (m["completed"], m["requests_per_s"], m["goodput_requests_per_s"]) == (0, 0, 0)
    assert m["ttft_ms"] == {"mean": None, "p50": None, "p90": None, "p99": None}


@pytest.mark.parametrize(
    ("goodput", "expected"),
    [
        (["ttft:150", "tpot:150"], 0.5),  # only the first: the others' TTFT is over
        (["ttft:300"], 1.5),  # all three that completed; the failed one never counts
        (["ttft:300", "e2el:900"], 1.0),  # the first's 1000 ms E2E is over
        (["ttft:300", "tpot:150"], 1.0),  # the second's TPOT is over; one token counts as 0
        (["tpot:50"], 0.5),  # only the one-token reply
    ],
)
def test_goodput_counts_requests_meeting_every_slo(goodput: list[str], expected: float) -> None:
    slo = serving.parse_slo(goodput)
    m = serving.compute_metrics(SYNTHETIC, 2.0, slo)
    assert m["goodput_requests_per_s"] == pytest.approx(expected)
    assert m["slo_ms"] == slo


@pytest.mark.parametrize("bad", ["itl:5", "ttft", "ttft:", "ttft:-1", "ttft:0"])
def test_slo_parse_refuses_what_it_cannot_check(bad: str) -> None:
    with pytest.raises(Exception, match="bad SLO"):
        serving.parse_slo([bad])


def test_lengths_and_mix_parse() -> None:
    assert serving.Lengths.parse("128") == serving.Lengths(128, 128)
    assert serving.Lengths.parse("64:256") == serving.Lengths(64, 256)
    draws = {serving.Lengths(3, 5).draw(random.Random(i)) for i in range(50)}
    assert draws == {3, 4, 5}
    for bad in ("0", "9:3", "x"):
        with pytest.raises((ValueError, Exception)):
            serving.Lengths.parse(bad)
    assert serving.parse_mix("greedy,seeded:3") == [("greedy", 1.0), ("seeded", 3.0)]
    with pytest.raises(Exception, match="unknown sampling kind"):
        serving.parse_mix("beam:1")


def test_prompts_have_the_requested_token_counts(tiny_model: Path) -> None:
    tokenizer = serving.load_tokenizer(tiny_model)
    maker = serving.PromptMaker(tokenizer)
    for n in (1, 7, 64, 300):
        texts = {maker.text(n, random.Random(seed)) for seed in range(4)}
        assert len(texts) == 4  # distinct prompts: no shared prefix cache hits
        for text in texts:
            assert len(tokenizer.encode(text, add_special_tokens=False)) == n


def test_workload_requests_are_reproducible_and_sampled_by_the_mix(tiny_model: Path) -> None:
    workload = serving.Workload(
        serving.PromptMaker(serving.load_tokenizer(tiny_model)),
        serving.Lengths(16, 48),
        serving.Lengths(8, 8),
        serving.parse_mix("greedy:1,temperature:1,seeded:1,json_schema:1"),
        0.7,
        seed=3,
        extra={"logit_bias": {"2": -100}},
    )
    specs = [workload.request(i) for i in range(40)]
    assert specs[5] == workload.request(5)  # every server gets the same request i
    assert all(16 <= s.prompt_tokens <= 48 and s.max_tokens == 8 for s in specs)
    assert {s.kind for s in specs} == set(serving.MIX_KINDS)
    for s in specs:
        body = serving.request_body("m", s)
        assert body["stream_options"] == {"include_usage": True}
        assert body["logit_bias"] == {"2": -100}
        assert body["temperature"] == (0.0 if s.kind == "greedy" else 0.7)
        assert ("seed" in body) == (s.kind == "seeded")
        assert ("response_format" in body) == (s.kind == "json_schema")
    assert workload.request(0, tag="warmup") != specs[0]


def test_a_shared_prefix_is_one_system_message_of_its_token_count(tiny_model: Path) -> None:
    """`--prefix-len 40`: every request starts with the same 40-token system message (a
    long agent prompt the prefix cache can serve), then its own user text."""
    args = serving.parse_args(
        ["--url", "http://x", "--model", str(tiny_model), "--prefix-len", "40",
         "--input-len", "8:12"]
    )  # fmt: skip
    workload = serving.build_workload(args, tiny_model)
    tokenizer = serving.load_tokenizer(tiny_model)
    specs = [workload.request(i) for i in range(6)]
    system = specs[0].messages[0]
    assert system["role"] == "system"
    assert len(tokenizer.encode(system["content"], add_special_tokens=False)) == 40
    for spec in specs:
        assert spec.messages[0] == system
        assert spec.messages[1]["role"] == "user"
        user = len(tokenizer.encode(spec.messages[1]["content"], add_special_tokens=False))
        assert 8 <= user <= 12 and spec.prompt_tokens == 40 + user
    assert len({spec.messages[1]["content"] for spec in specs}) == 6
    with pytest.raises(SystemExit):
        serving.parse_args(["--url", "http://x", "--prefix-len", "0"])


def test_image_requests_carry_their_own_images_before_the_text(tiny_model: Path) -> None:
    """`--images 2`: each prompt is two data-URL JPEGs of the size asked, then its text; the
    same request gets the same images for every server, other requests other images."""
    workload = serving.Workload(
        serving.PromptMaker(serving.load_tokenizer(tiny_model)),
        serving.Lengths(16, 16),
        serving.Lengths(8, 8),
        serving.parse_mix("greedy"),
        0.7,
        seed=1,
        images=2,
        image_size=serving.parse_size("64x32"),
    )
    first, again, other = workload.request(0), workload.request(0), workload.request(1)
    parts = first.messages[0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    assert first.prompt_tokens == 16  # the text's tokens; the images are the model's to count
    url = parts[0]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert image.size == (64, 32)
    assert again == first
    assert parts[0] != parts[1]
    assert other.messages[0]["content"][0] != parts[0]


def test_jsonl_conversations(tmp_path: Path) -> None:
    lines = [
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "tell me about the sea"},
                {"role": "assistant", "content": "it is wide and deep"},
            ]
        },
        {"conversations": [{"from": "human", "value": "a story"}, {"from": "gpt", "value": "x y"}]},
        {"prompt": "count to ten", "max_tokens": 12},
        {"messages": [{"role": "user", "content": "hi"}]},
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines[:2]) + "\n\n")
    with path.open("a") as f:
        f.write("\n".join(json.dumps(line) for line in lines[2:]) + "\n")
    conversations = serving.load_conversations(path, lambda text: len(text.split()))
    assert [c.messages for c in conversations] == [
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "tell me about the sea"},
        ],
        [{"role": "user", "content": "a story"}],
        [{"role": "user", "content": "count to ten"}],
        [{"role": "user", "content": "hi"}],
    ]
    # the reference reply's length, a line's max_tokens, or nothing known
    assert [c.output_tokens for c in conversations] == [5, 2, 12, None]

    path.write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2:"):
        serving.load_conversations(path, len)
    path.write_text('{"messages": [{"role": "assistant", "content": "only me"}]}\n')
    with pytest.raises(ValueError, match="nothing to send"):
        serving.load_conversations(path, len)


def test_dataset_workload_takes_output_lengths_from_the_conversations(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": "a b c", "max_tokens": 5}\n{"prompt": "d e"}\n')
    prompts = serving.PromptMaker(None)
    workload = serving.Workload(
        prompts,
        serving.Lengths(1, 1),
        serving.Lengths(9, 9),
        [("greedy", 1.0)],
        0.7,
        seed=0,
        conversations=serving.load_conversations(path, prompts.count),
    )
    specs = [workload.request(i) for i in range(3)]
    assert [s.messages[0]["content"] for s in specs] == ["a b c", "d e", "a b c"]
    assert [s.max_tokens for s in specs] == [5, 9, 5]  # --output-len where none is known


def _sse(*chunks: dict[str, Any] | str) -> bytes:
    events = [c if isinstance(c, str) else f"data: {json.dumps(c)}\n\n" for c in chunks]
    return ("".join(events) + "data: [DONE]\n\n").encode()


def _delta(content: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {"role": "assistant"} if content is None else {"content": content}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def _send(body: bytes, status: int = 200) -> Any:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))
    spec = serving.RequestSpec(7, [{"role": "user", "content": "hi"}], 1, 16, "greedy", {})
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await serving.send_request(http, "m", spec, 0.0)


async def test_stream_parsing_counts_tokens_from_usage() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}
    r = await _send(
        _sse(
            ": keepalive\n\n",
            _delta(None),
            _delta("a"),
            _delta("bc"),
            _delta("d"),
            _delta(None, "length"),
            usage,
        )
    )
    assert r.ok and r.error is None
    assert (r.chunks, len(r.itl), r.output_tokens, r.tokens_from) == (3, 2, 5, "usage")
    assert (r.prompt_tokens, r.finish_reason, r.index) == (9, "length", 7)
    assert 0 < r.ttft <= r.ttft + sum(r.itl) <= r.latency
    assert r.tpot == pytest.approx((r.latency - r.ttft) / 4)


async def test_stream_parsing_falls_back_to_content_chunks_without_usage() -> None:
    r = await _send(_sse(_delta("a"), _delta("b"), _delta("c", "stop")))
    assert r.ok
    assert (r.output_tokens, r.tokens_from, r.prompt_tokens) == (3, "chunks", None)
    m = serving.compute_metrics([r, record(0.1, 0.2, 2)], 1.0, {})
    assert m["output_tokens_from"] == ["chunks", "usage"]  # mixed: both named


async def test_failures_become_records_not_exceptions() -> None:
    refused = await _send(b'{"error": {"message": "no"}}', status=400)
    assert not refused.ok and refused.error.startswith("HTTP 400: ")
    empty = await _send(_sse(_delta(None, "stop")))
    assert not empty.ok and empty.error == "the stream carried no content"
    errored = await _send(_sse(_delta("a"), {"error": {"message": "boom"}}))
    assert not errored.ok and "boom" in errored.error


async def _run_load(load: Any) -> tuple[list[int], int]:
    workload = serving.Workload(
        serving.PromptMaker(None),
        serving.Lengths(4, 4),
        serving.Lengths(4, 4),
        [("greedy", 1)],
        0,
        0,
    )
    sent: list[int] = []
    in_flight = peak = 0

    async def send(spec: Any) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        sent.append(spec.index)
        in_flight -= 1

    await serving.run_load(send, workload, load, seed=0)
    return sent, peak


async def test_closed_loop_keeps_n_clients_busy_until_the_count() -> None:
    sent, peak = await _run_load(serving.Load(3, None, None, 10, None))
    assert sorted(sent) == list(range(10)) and peak == 3


async def test_open_loop_sends_every_arrival_under_the_concurrency_cap() -> None:
    sent, peak = await _run_load(serving.Load(None, 10_000.0, 2, 12, None))
    assert sorted(sent) == list(range(12)) and peak <= 2


async def test_image_clients_send_images_and_the_others_text_alone() -> None:
    """`--image-clients 1` of 3 clients: one client's requests carry images, the other two's
    text alone; the metrics are reported for each class and for both together."""
    workload = serving.Workload(
        serving.PromptMaker(None),
        serving.Lengths(4, 4),
        serving.Lengths(4, 4),
        [("greedy", 1)],
        0,
        0,
        images=1,
        image_size=(16, 16),
    )
    clients: dict[int, list[int]] = {}

    async def send(spec: Any) -> Any:
        client = id(trio.lowlevel.current_task())
        clients.setdefault(client, []).append(spec.images)
        await trio.lowlevel.checkpoint()
        parts = spec.messages[0]["content"]
        assert isinstance(parts, list) == bool(spec.images)
        r = record(0.1, 1.0, 10, itl=[0.1] * 9)
        r.images = spec.images
        return r

    await serving.run_load(send, workload, serving.Load(3, None, None, 12, None, 1), seed=0)
    assert sorted(tuple(set(images)) for images in clients.values()) == [(0,), (0,), (1,)]

    records = [record(0.1, 1.0, 10), record(0.2, 1.0, 10), record(0.4, 1.0, 10)]
    records[0].images = 1
    by_class = serving.metrics_by_class(records, 2.0, {})
    assert by_class["image"]["completed"] == 1 and by_class["text"]["completed"] == 2
    assert by_class["text"]["ttft_ms"]["p50"] == pytest.approx(300)
    assert serving.metrics_by_class(records[1:], 2.0, {}) == {}


def test_image_clients_needs_a_closed_loop_with_images() -> None:
    assert serving.parse_args(["--server", "ours", "--images", "1", "--image-clients", "2"])
    for bad in (["--image-clients", "2"], ["--images", "1", "--rate", "2", "--image-clients", "1"]):
        with pytest.raises(SystemExit):
            serving.parse_args(["--server", "ours", *bad])
    with pytest.raises(SystemExit):
        serving.parse_args(["--server", "ours", "--images", "1", "--image-clients", "9"])


def test_tool_runs_against_our_server(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "serving.json"
    command = [sys.executable, str(ROOT / "bench" / "serving.py"), "--server", "ours"]
    command += ["--model", str(tiny_model), "--clients", "2", "--num-requests", "6"]
    command += ["--input-len", "24", "--output-len", "12", "--ignore-eos", "--warmup", "1"]
    command += ["--mix", "temperature,seeded", "--goodput", "ttft:60000", "--out", str(out)]
    # A stand-in for nvidia-smi on the PATH: the GPU's busy share is sampled over the load
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nwhile :; do echo 40; sleep 0.01; done\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| ours | 6 / 0 |" in done.stdout
    assert "GPU busy beside ours: 40.0% (nvidia-smi)" in done.stdout

    document = json.loads(out.read_text())
    assert document["complete"] is True  # the file written after each run, final at the end
    assert document["git"]["commit"] and document["machine"]["cpus"] >= 1
    assert "--num-requests 6" in document["command"]
    [server] = document["servers"]
    assert server["gpu_busy_pct"] == 40.0 and server["rounds"][0]["gpu_busy_pct"] == 40.0
    assert server["rounds"][0]["ready_s"] > 0  # from its launch to its first ready answer
    assert f"ours ready {server['rounds'][0]['ready_s']} s after its launch" in done.stdout
    m, summary = server["metrics"], server["records_summary"]
    assert (m["completed"], m["failed"], m["output_tokens"]) == (6, 0, 72)
    assert m["output_tokens_from"] == "usage"
    assert m["goodput_requests_per_s"] == m["requests_per_s"] > 0
    assert m["output_tokens_per_s"] == pytest.approx(12 * m["requests_per_s"])
    assert 0 < m["ttft_ms"]["p50"] <= m["ttft_ms"]["p99"] < m["e2el_ms"]["p99"]
    assert m["tpot_ms"]["p50"] > 0 and m["itl_ms"]["p50"] > 0
    assert summary["output_tokens"] == {"min": 12, "mean": 12.0, "max": 12, "at_max_tokens": 6}
    assert summary["prompt_tokens_requested_mean"] == 24
    assert summary["prompt_tokens_server_mean"] > 24  # the chat template's tokens
    assert sum(summary["by_kind"].values()) == 6 and summary["errors"] == []
    # the server it started is gone
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server['url']}/health", timeout=5)


gpu_busy = sys.modules["_gpu_busy"]  # loaded by bench/serving.py from its folder


def test_gpu_busy_is_the_mean_of_the_samples_inside_the_window() -> None:
    busy = gpu_busy.GpuBusy()
    for at, line in [(1.0, "10"), (2.0, " 30 "), (2.5, "[N/A]"), (3.0, "50"), (9.0, "90")]:
        busy.take(line, at)
    assert [value for _, value in busy.samples] == [10.0, 30.0, 50.0, 90.0]
    assert busy.mean(2.0, 3.0) == 40.0  # the load's window: neither its start nor its drain
    assert busy.mean(1.0, 9.0) == 45.0
    assert busy.mean(4.0, 8.0) is None


def test_runs_pool_their_gpu_busy_by_duration() -> None:
    runs = [
        {"gpu_busy_pct": 50.0, "duration_s": 1.0},
        {"gpu_busy_pct": 80.0, "duration_s": 3.0},
        {"gpu_busy_pct": None, "duration_s": 5.0},
    ]
    assert serving.pooled_gpu_busy(runs) == 72.5
    assert serving.pooled_gpu_busy(runs[2:]) is None


def _program(path: Path, script: str) -> Path:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


async def test_the_sampler_reads_the_program_to_its_end(tmp_path: Path) -> None:
    smi = _program(tmp_path / "smi", "printf '10\\n20\\n[N/A]\\n30\\n'")
    async with gpu_busy.sample_gpu_busy((str(smi),)) as busy:
        assert busy is not None
        await busy.ended.wait()
    assert [value for _, value in busy.samples] == [10.0, 20.0, 30.0]
    assert busy.mean(0.0, float("inf")) == 20.0


async def test_the_sampler_is_stopped_when_the_block_ends(tmp_path: Path) -> None:
    smi = _program(tmp_path / "smi", "echo 70; exec sleep 600")  # runs until it is stopped
    async with gpu_busy.sample_gpu_busy((str(smi),)) as busy:
        assert busy is not None
    assert busy.ended.is_set()


async def test_no_sampler_without_the_program(tmp_path: Path) -> None:
    async with gpu_busy.sample_gpu_busy((str(tmp_path / "absent"),)) as busy:
        assert busy is None
