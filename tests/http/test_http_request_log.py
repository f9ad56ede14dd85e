"""The request log over a real server: one line per request, written when the request and its
generation have ended, with its fields; JSON lines under --log-format json; never the
prompt or the output."""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_nursery.logs import JsonFormatter, TextFormatter, Verbatim
from tests.http_helpers import (
    chat_body,
    eventually,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
)

SECRET = "zebra-marmalade-4417"  # in every prompt; must appear in no log line


def request_lines(caplog: pytest.LogCaptureFixture) -> dict[str, dict[str, Any]]:
    """The request log's fields by request id."""
    return {
        r.request["request_id"]: r.request  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "mlx_nursery.requests"
    }


async def test_one_line_per_request_with_its_fields_and_never_its_text(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with (
        running_server(tiny_model) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        done = await http.post(
            "/v1/chat/completions",
            json=chat_body(SECRET, max_tokens=3, temperature=0),
            headers={"x-request-id": "done-1"},
        )
        assert done.status_code == 200
        refused = await http.post(
            "/v1/chat/completions",
            json=chat_body(SECRET, max_tokens=0),
            headers={"x-request-id": "refused-1"},
        )
        assert refused.status_code == 400
        body = chat_body(SECRET, max_tokens=3000, temperature=0, stream=True)
        stream = await raw_http(
            port_of(server),
            post_request("/v1/chat/completions", body).replace(
                b"\r\n\r\n", b"\r\nx-request-id: left-1\r\n\r\n", 1
            ),
        )
        await read_until(stream, b"data: ")
        await stream.aclose()  # the client leaves mid-stream
        await eventually(lambda: "left-1" in request_lines(caplog), "the line of the one that left")

    lines = request_lines(caplog)
    assert lines["done-1"] | {"ttft_s": None, "duration_s": None} == {
        "request_id": "done-1",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "model": "tiny",
        "prompt_tokens": done.json()["usage"]["prompt_tokens"],
        "completion_tokens": 3,
        "finish_reason": "length",
        "cancel_cause": None,
        "error": None,
        "ttft_s": None,
        "duration_s": None,
    }
    assert 0 < lines["done-1"]["ttft_s"] <= lines["done-1"]["duration_s"]
    assert (lines["refused-1"]["status"], lines["refused-1"]["error"]) == (400, "invalid_value")
    assert lines["refused-1"]["completion_tokens"] is None
    left = lines["left-1"]
    assert (left["status"], left["cancel_cause"], left["finish_reason"]) == (200, "client", None)
    assert sum(1 for r in caplog.records if r.name == "mlx_nursery.requests") == len(lines)

    formatter = JsonFormatter()
    for record in caplog.records:
        line = formatter.format(record)
        assert "\n" not in line
        parsed = json.loads(line)
        assert parsed["logger"] == record.name and parsed["level"] == record.levelname.lower()
        if record.name == "mlx_nursery.requests":
            assert parsed["request_id"] in lines and parsed["status"] is not None
    assert SECRET not in caplog.text
    assert all(SECRET not in formatter.format(r) for r in caplog.records)


async def test_a_request_cannot_forge_log_lines_or_fields(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a key: a newline or an ANSI escape in the path, a request id with spaces.
    Every line the text format writes stays one line, with no control character, and the
    request's line carries the path as it came and an id of the server's own."""
    caplog.set_level(logging.DEBUG)  # Hypercorn's access log too, which has the decoded path
    forged = "/v1/models/x%0a2024-01-01 00:00:00 INFO mlx_nursery.requests: admin%1b[2J"
    async with (
        running_server(tiny_model, api_key="k", log_level="debug", skip_warmup=True) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        refused = await http.get(forged, headers={"x-request-id": "a status=200 model=gpt-4"})
        assert refused.status_code == 401
        request_id = refused.headers["x-request-id"]
        assert request_id.startswith("req_")  # not the client's: it was no plain token
        kept = await http.get("/health", headers={"x-request-id": "client-id_1.2:3"})
        assert kept.headers["x-request-id"] == "client-id_1.2:3"
        await eventually(lambda: request_id in request_lines(caplog), "the refused one's line")

    line = request_lines(caplog)[request_id]
    assert line["path"] == forged.replace(" ", "%20")  # as it came, percent-encoded
    formatter = TextFormatter()
    texts = [formatter.format(record) for record in caplog.records]
    assert all("\n" not in text and "\x1b" not in text for text in texts)
    access = [text for text in texts if "\\x1b" in text]
    assert access, "Hypercorn's access line, with the decoded path, escaped"
    assert any("\\n2024-01-01" in text for text in access)
    [request_text] = [t for t in texts if request_id in t and "mlx_nursery.requests" in t]
    assert "status=200" not in request_text and "model=gpt-4" not in request_text
    # A traceback's frames keep their lines (they are the server's own text).
    record = logging.LogRecord(
        "x", logging.ERROR, "", 0, "a %s\n%s", ("b\nc", Verbatim("d\ne")), None
    )
    assert formatter.format(record).endswith("a b\\nc\nd\ne")


def test_hypercorns_own_cli_logs_the_model_load_and_each_request(tiny_model: Path) -> None:
    """`hypercorn -k trio mlx_nursery.asgi:app` logs what `mlx-nursery serve` logs: the
    model's load and a line per request (Hypercorn's CLI configures only its own loggers),
    and Hypercorn's own lines once each."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "MLX_NURSERY_MODEL": str(tiny_model),
        "MLX_NURSERY_SERVED_MODEL_NAME": "tiny",
        "MLX_NURSERY_RESPONSES_DB": ":memory:",
        "MLX_NURSERY_SKIP_WARMUP": "1",
        "MLX_NURSERY_LOG_FORMAT": "json",
    }
    command = [sys.executable, "-m", "hypercorn", "-k", "trio", "-b", "127.0.0.1:0"]
    process = subprocess.Popen(
        [*command, "mlx_nursery.asgi:app"], stderr=subprocess.PIPE, text=True, env=env
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr or ()])
    reader.start()
    seen: list[str] = []

    def wait_for(pattern: str) -> re.Match[str]:
        """The first line (read so far or next) that matches `pattern`; fails after 60 s."""
        deadline = time.monotonic() + 60
        while True:
            for line in seen:
                if match := re.search(pattern, line):
                    return match
            seen.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))

    try:
        port = int(wait_for(r"Running on http://127\.0\.0\.1:(\d+)").group(1))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            while http.get("/health").status_code != 200:  # the model loads in the background
                time.sleep(0.05)
            reply = http.post(
                "/v1/chat/completions",
                json=chat_body(SECRET, max_tokens=2, temperature=0),
                headers={"x-request-id": "via-hypercorn"},
            )
            assert reply.status_code == 200
        wait_for("via-hypercorn")  # the request's line is written once its job has ended
    finally:
        process.terminate()
        process.wait(timeout=60)
        reader.join()
    while not lines.empty():
        seen.append(lines.get())
    ours = [json.loads(line) for line in seen if line.startswith("{")]
    messages = [line["message"] for line in ours]
    assert "loading model tiny" in messages
    assert any(m.startswith("model tiny loaded in") for m in messages)
    request = next(line for line in ours if line.get("request_id") == "via-hypercorn")
    assert (request["logger"], request["status"], request["completion_tokens"]) == (
        "mlx_nursery.requests",
        200,
        2,
    )
    assert sum("Running on http://" in line for line in seen) == 1  # not written twice
    assert SECRET not in "".join(seen)
