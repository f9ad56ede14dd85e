"""Disconnect check: N concurrent image streams (max_tokens large, EOS ignored), each dropped
after K content chunks; then what the server computed after the drops.

ours: `/metrics` is polled every 10 ms until num_requests_running is back to 0 (time from the
last drop), and the request_cancelled counter is read. mlx-vlm's server: its log's
"Generation cancelled: request=... generated_tokens=N" lines (INFO) give each generation's
count at its cancel; the count minus the K chunks the client read is computed after the drop.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import httpx
import trio

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("bench_serving", HERE.parent / "bench" / "serving.py")
serving = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = serving
spec.loader.exec_module(serving)


def running(text: str) -> float | None:
    m = re.search(r"^mlx_nursery:num_requests_running\{[^}]*\} (\S+)", text, re.M)
    return float(m.group(1)) if m else None


def cancelled(text: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'^mlx_nursery:request_cancelled_total\{.*cause="([^"]+)".*\} (\S+)', text, re.M
        )
    }


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--kind", choices=("ours", "mlx_vlm"), required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--log", type=Path)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--drop-after", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--images", type=int, default=1)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    workload = serving.Workload(
        serving.PromptMaker(serving.load_tokenizer(a.model)),
        serving.Lengths(64, 64),
        serving.Lengths(a.max_tokens, a.max_tokens),
        [("temperature", 1.0)],
        0.7,
        seed=11,
        extra={"logit_bias": {str(i): -100 for i in serving.eos_ids(a.model)}},
        images=a.images,
    )
    async with httpx.AsyncClient(base_url=a.url, timeout=120) as http:
        if a.kind == "ours":
            model = (await http.get("/v1/models")).json()["data"][0]["id"]
            before = cancelled((await http.get("/metrics")).text)
        else:
            model = str(a.model)
        log_lines_before = (
            a.log.read_text(errors="replace").count("Generation cancelled") if a.log else 0
        )
        drops: list[float] = []
        gaps: list[float] = []

        async def one(i: int) -> None:
            body = serving.request_body(model, workload.request(i, tag="disconnect"))
            chunks, last = 0, None
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:") and '"content":' in line and '"content":""' not in line:
                        now = time.perf_counter()
                        if last is not None:
                            gaps.append(now - last)
                        last, chunks = now, chunks + 1
                        if chunks >= a.drop_after:
                            break
            drops.append(time.perf_counter())  # the stream is closed: the client is gone

        async with trio.open_nursery() as n:
            for i in range(a.streams):
                n.start_soon(one, i)
        last_drop = max(drops)
        result: dict = {
            "server": a.kind,
            "streams": a.streams,
            "dropped_after_chunks": a.drop_after,
            "max_tokens": a.max_tokens,
        "images": a.images,
            "itl_ms_mean_before_drop": 1000 * sum(gaps) / len(gaps) if gaps else None,
        }
        deadline = last_drop + 30
        if a.kind == "ours":
            free_at = None
            while time.perf_counter() < deadline:
                text = (await http.get("/metrics")).text
                if running(text) == 0:
                    free_at = time.perf_counter()
                    break
                await trio.sleep(0.01)
            after = cancelled((await http.get("/metrics")).text)
            result["lanes_free_ms_after_last_drop"] = (
                None if free_at is None else 1000 * (free_at - last_drop)
            )
            result["cancelled_by_cause"] = {k: after[k] - before.get(k, 0) for k in after}
            if free_at is not None and result["itl_ms_mean_before_drop"]:
                result["tokens_after_drop_estimate_per_stream"] = (
                    result["lanes_free_ms_after_last_drop"] / result["itl_ms_mean_before_drop"]
                )
        else:
            counts: list[int] = []
            while time.perf_counter() < deadline:
                text = a.log.read_text(errors="replace")
                lines = re.findall(r"Generation cancelled: request=\S+ generated_tokens=(\d+)", text)
                counts = [int(c) for c in lines[log_lines_before:]]
                if len(counts) >= a.streams:
                    result["all_cancelled_ms_after_last_drop"] = 1000 * (
                        time.perf_counter() - last_drop
                    )
                    break
                await trio.sleep(0.01)
            result["generated_tokens_at_cancel"] = counts
            result["tokens_after_drop_per_stream"] = [c - a.drop_after for c in counts]
            completed = re.findall(
                r"Decode completed: request=\S+ generated_tokens=(\d+)",
                a.log.read_text(errors="replace"),
            )
            result["decode_completed_lines_total"] = len(completed)
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")


trio.run(main)
