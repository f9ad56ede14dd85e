"""Connections and bodies that would hold the server, through a real server and raw sockets:
requests without a key are answered before their body and closed, connections past the cap
are refused at once while a client with a key is still served, a body that stops arriving
gets a 408, and what the server does not speak (WebSocket, cleartext HTTP/2, a urlencoded
form where a file is expected) is refused cleanly.

One server serves the module (a thread of its own: `server_thread`); its body timeout is
long, so that a request that waited for its body would hang the test rather than pass.
"""

from __future__ import annotations

import json
import logging
import resource
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from mlx_nursery.http import OPEN_FILES_RESERVE
from mlx_nursery.http._body_pace import body_deadline
from mlx_nursery.server import Running
from tests.http_helpers import (
    chat_body,
    eventually,
    port_of,
    raw_http,
    running_server,
    server_thread,
    validate_error,
)

CAP = 4
KEY = "conn-key"
HANG = 60  # a bound on what must not hang; never reached when the server behaves


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Running]:
    with server_thread(
        tiny_model, api_key=KEY, max_connections=CAP, body_timeout=600.0, skip_warmup=True
    ) as served:
        yield served.running


def head(
    path: str, *, key: bool, length: int | None = None, content_type: str = "application/json"
) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {content_type}"]
    if key:
        lines.append(f"Authorization: Bearer {KEY}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def answer(stream: trio.SocketStream) -> tuple[int, dict[str, str], bytes]:
    """The next response on `stream`: its status, headers (lower-cased) and body."""
    data = b""
    with trio.fail_after(HANG):
        while b"\r\n\r\n" not in data:
            piece = await stream.receive_some(65536)
            assert piece, f"closed before a response: {data!r}"
            data += piece
        head_part, _, body = data.partition(b"\r\n\r\n")
        status = int(head_part.split(b" ", 2)[1])
        headers = {}
        for line in head_part.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        while len(body) < int(headers.get("content-length", "0")):
            piece = await stream.receive_some(65536)
            assert piece, "closed before the body's end"
            body += piece
    return status, headers, body


async def closed_by_server(stream: trio.SocketStream) -> bool:
    """Whether the server closed `stream` (an end of stream, or a reset: it closed with the
    client's bytes unread); hangs (then fails) while it keeps it open."""
    with trio.fail_after(HANG):
        try:
            return await stream.receive_some(65536) == b""
        except trio.BrokenResourceError:
            return True


def open_connections(server: Running) -> float:
    value = server.parts.metrics.registry.get_sample_value("mlx_nursery:http_connections_open")
    return value or 0.0


def refused(server: Running, reason: str) -> float:
    value = server.parts.metrics.registry.get_sample_value(
        "mlx_nursery:http_refused_total", {"reason": reason}
    )
    return value or 0.0


async def test_a_request_without_a_key_is_answered_before_its_body_and_closed(
    server: Running,
) -> None:
    # The head announces a body that never comes: the 401 must not wait for it.
    stream = await raw_http(
        port_of(server), head("/v1/chat/completions", key=False, length=100_000)
    )
    async with stream:
        status, headers, body = await answer(stream)
        assert status == 401
        assert headers["connection"] == "close" and headers["www-authenticate"] == "Bearer"
        validate_error(json.loads(body))
        assert json.loads(body)["error"]["code"] == "invalid_api_key"
        assert await closed_by_server(stream)


async def test_a_flood_of_keyless_connections_past_the_cap_leaves_a_keyed_client_served(
    server: Running,
) -> None:
    statuses: list[int | str] = []

    async def keyless() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port_of(server))
        async with stream:
            try:
                await stream.send_all(head("/v1/chat/completions", key=False, length=1000))
                status, _, _ = await answer(stream)
            except trio.BrokenResourceError:
                statuses.append("reset")  # refused past the cap before its head was read
                return
            statuses.append(status)
            assert await closed_by_server(stream)  # nothing held once answered

    async with trio.open_nursery() as nursery:
        for _ in range(3 * CAP):
            nursery.start_soon(keyless)
    assert 401 in statuses and set(statuses) <= {401, 503, "reset"}, statuses
    await eventually(lambda: open_connections(server) == 0, "the flood's connections closed")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        reply = await http.post(
            "/v1/chat/completions",
            json=chat_body(max_tokens=2, temperature=0),
            headers={"Authorization": f"Bearer {KEY}"},
        )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2


async def test_connections_past_the_cap_are_refused_at_once_and_the_server_recovers(
    server: Running,
) -> None:
    await eventually(lambda: open_connections(server) == 0, "earlier connections closed")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Raised toward the hard limit at startup (an infinite one: as far as the cap needs).
    assert soft == hard or soft >= CAP + OPEN_FILES_RESERVE
    body = json.dumps(chat_body(max_tokens=1, temperature=0)).encode()
    # Each holds a connection: a keyed request whose body is on its way.
    held = [
        await raw_http(
            port_of(server), head("/v1/chat/completions", key=True, length=len(body)) + body[:5]
        )
        for _ in range(CAP)
    ]
    await eventually(lambda: open_connections(server) == CAP, "the held connections counted")
    before = refused(server, "max_connections")
    extra = await trio.open_tcp_stream("127.0.0.1", port_of(server))
    async with extra:
        status, headers, refusal = await answer(extra)
        assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
        validate_error(json.loads(refusal))
        assert json.loads(refusal)["error"]["code"] == "too_many_connections"
        assert await closed_by_server(extra)
    assert refused(server, "max_connections") == before + 1
    # A held request whose body arrives is served as usual.
    first = held.pop(0)
    async with first:
        await first.send_all(body[5:])
        status, _, reply = await answer(first)
        assert status == 200 and json.loads(reply)["usage"]["completion_tokens"] == 1
    await eventually(lambda: open_connections(server) == CAP - 1, "its connection closed")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        listed = await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert listed.status_code == 200
    for stream in held:
        await stream.aclose()


async def test_a_urlencoded_body_on_the_audio_routes_is_refused_before_it_is_read(
    server: Running,
) -> None:
    await eventually(lambda: open_connections(server) == 0, "earlier connections closed")
    form = "application/x-www-form-urlencoded"
    # 20 MB announced, none sent: the 415 comes at once, the body unread and unparsed.
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        stream = await raw_http(
            port_of(server), head(path, key=True, length=20_000_000, content_type=form)
        )
        async with stream:
            status, headers, body = await answer(stream)
            assert (status, headers["connection"]) == (415, "close")
            validate_error(json.loads(body))
            assert json.loads(body)["error"]["code"] == "unsupported_media_type"
            assert await closed_by_server(stream)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        whole = await http.post(
            "/v1/audio/transcriptions",
            data={"model": "whisper", "a": "b" * 1000},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert whole.status_code == 415
        assert (await http.get("/health")).status_code == 200


async def test_websocket_cleartext_http2_and_non_http_are_refused_without_a_traceback(
    server: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = port_of(server)
    upgrade = (
        b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    async with await raw_http(port, upgrade) as stream:
        status, headers, body = await answer(stream)
        assert status == 404 and headers["content-type"] == "application/json"
        validate_error(json.loads(body))
        assert await closed_by_server(stream)
    # An h2c upgrade is ignored: answered in HTTP/1.1, the connection kept.
    h2c = (
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
    async with await raw_http(port, h2c) as stream:
        status, headers, body = await answer(stream)
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await answer(stream))[0] == 200
    # HTTP/2 with prior knowledge: a 505, and the connection closed.
    async with await raw_http(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") as stream:
        status, _, body = await answer(stream)
        assert status == 505
        assert json.loads(body)["error"]["code"] == "http_version_not_supported"
        assert await closed_by_server(stream)
    # What is not HTTP/1.1 at all: h11's 400, in the envelope, and the connection closed.
    for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n"):
        async with await raw_http(port, garbage) as stream:
            status, headers, body = await answer(stream)
            assert status == 400 and headers["content-type"] == "application/json"
            validate_error(json.loads(body))
            assert json.loads(body)["error"]["code"] == "malformed_request"
            assert await closed_by_server(stream)
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not problems, [r.getMessage() for r in problems]
    assert "Traceback" not in caplog.text


async def test_a_body_that_stops_arriving_gets_a_408_and_its_connection_closes(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_server(
        tiny_model, body_timeout=0.2, body_min_rate=0, skip_warmup=True
    ) as server:
        body = json.dumps(chat_body(max_tokens=1)).encode()
        start = head("/v1/chat/completions", key=False, length=len(body))
        stream = await raw_http(
            port_of(server),
            start.replace(b"\r\n\r\n", b"\r\nx-request-id: slow-1\r\n\r\n") + body[:10],
        )
        async with stream:
            status, headers, reply = await answer(stream)
            assert (status, headers["connection"], headers["x-request-id"]) == (
                408,
                "close",
                "slow-1",
            )
            validate_error(json.loads(reply))
            assert json.loads(reply)["error"]["code"] == "request_body_timeout"
            assert await closed_by_server(stream)
        assert refused(server, "body_timeout") == 1
        await eventually(
            lambda: any(
                getattr(r, "request", {}).get("request_id") == "slow-1" for r in caplog.records
            ),
            "the request's log line",
        )
        line = next(
            r.request
            for r in caplog.records
            if getattr(r, "request", {}).get("request_id") == "slow-1"
        )  # type: ignore[attr-defined]
        assert (line["status"], line["error"]) == (408, "request_body_timeout")
        async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
            ok = await http.post("/v1/chat/completions", json=chat_body(max_tokens=1))
            assert ok.status_code == 200  # a body that comes at once is read as ever


def test_a_body_earns_time_as_it_arrives() -> None:
    assert body_deadline(100.0, 0, 10.0, 1000) == 110.0
    assert body_deadline(100.0, 5000, 10.0, 1000) == 115.0
    assert body_deadline(100.0, 5000, 10.0, 0) == 110.0  # no rate: the timeout alone
