"""Disconnects, timeouts, overload and shutdown over a real server: compute stops, lanes free."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
from hypercorn.config import Config as HypercornConfig

from mlx_nursery import server as server_module
from mlx_nursery.server import hypercorn_config
from mlx_nursery.settings import Settings
from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    engine_of,
    eventually,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
    sdk,
    server_thread,
    spawned_server,
    sse_events,
    validate_error,
)

# Tokens a request would run to if nothing stopped it (the tiny model never emits EOS at T=0).
LONG = 3000


def _generated(server: object) -> int:
    stats = engine_of(server).statistics().worker  # type: ignore[arg-type]
    return stats.generated_tokens if stats else 0


@pytest.fixture(scope="module")
def one_lane(tiny_model: Path) -> Iterator[ThreadedServer]:
    with server_thread(tiny_model, max_concurrency=1) as served:
        yield served


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_stops_compute_and_frees_the_lane(
    one_lane: ThreadedServer, stream: bool
) -> None:
    async with borrowed(one_lane) as server:
        engine = engine_of(server)
        generated, late = _generated(server), engine.statistics().late_events
        body = chat_body(max_tokens=LONG, temperature=0, stream=stream)
        connection = await raw_http(port_of(server), post_request("/v1/chat/completions", body))
        if stream:
            await read_until(connection, b"data: ")  # the stream is running
        else:
            await eventually(lambda: _generated(server) > generated, "the request is generating")
        await connection.aclose()

        # The next request is served at once: the first one's lane came back on disconnect.
        reply = await sdk(server).chat.completions.create(**chat_body(max_tokens=4, temperature=0))
        assert reply.usage.completion_tokens == 4
        stats = engine.statistics()
        assert stats.lanes_borrowed == 0 and stats.late_events == late
        assert _generated(server) - generated < LONG / 2, "the disconnected request kept generating"


async def test_a_client_that_stops_reading_does_not_hold_the_lane(tiny_model: Path) -> None:
    async with running_server(tiny_model, max_concurrency=1, request_timeout=2.0) as server:
        body = chat_body(max_tokens=LONG, temperature=0, stream=True)
        stalled = await raw_http(port_of(server), post_request("/v1/chat/completions", body))
        await read_until(stalled, b"data: ")
        # Never read again; the job's own deadline ends the compute though the response is stuck.
        await eventually(
            lambda: engine_of(server).statistics().lanes_borrowed == 0, "lane returned"
        )
        reply = await sdk(server).chat.completions.create(**chat_body(max_tokens=2, temperature=0))
        assert reply.usage.completion_tokens == 2
        await stalled.aclose()


async def slow_reader(port: int, request: bytes) -> trio.SocketStream:
    """A client whose receive buffer is small, so that the server's writes to it block as
    soon as it stops reading (the kernel's buffers do not absorb the answer)."""
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    await stream.send_all(request)
    return stream


async def test_a_reader_behind_when_the_deadline_passes_still_gets_its_whole_answer(
    tiny_model: Path,
) -> None:
    """The request timeout bounds the compute, not the client's reading: an answer computed
    in time reaches a client that reads it only after the deadline, whole, with no error
    (it was cut with a false internal_error while the job waited on the client)."""
    timeout = 4.0
    async with running_server(tiny_model, request_timeout=timeout) as server:
        body = chat_body(max_tokens=120, temperature=0, stream=True, logprobs=True)
        body["top_logprobs"] = 20  # large chunks: the writes block within a few tokens
        started = trio.current_time()
        stream = await slow_reader(port_of(server), post_request("/v1/chat/completions", body))
        await eventually(
            lambda: engine_of(server).statistics().lanes_borrowed == 0, "the compute ended"
        )
        assert trio.current_time() - started < timeout, "the compute itself took too long"
        # The scenario, not a synchronization: the deadline passes while nobody reads.
        await trio.sleep(timeout - (trio.current_time() - started) + 0.5)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
            if data.endswith(b"data: [DONE]\r\n\r\n") or data.endswith(b"data: [DONE]\n\n"):
                break
        await stream.aclose()
    events = [line[6:] for line in data.split(b"\n") if line.startswith(b"data: {")]
    chunks = [json.loads(event) for event in events]
    assert all("error" not in chunk for chunk in chunks)
    assert b"data: [DONE]" in data
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert finishes[-1] == "length"
    assert sum(bool(c["choices"][0]["delta"].get("content")) for c in chunks if c["choices"]) > 0


def open_connections(server: Any) -> float | None:
    registry = server.parts.metrics.registry
    value: float | None = registry.get_sample_value("mlx_nursery:http_connections_open")
    return value


def stalled_request() -> bytes:
    body = chat_body(max_tokens=200, temperature=0, stream=True, logprobs=True)
    body["top_logprobs"] = 20  # large chunks: the writes block within a few tokens
    return post_request("/v1/chat/completions", body)


async def test_a_client_that_accepts_nothing_loses_its_connection_after_the_send_timeout(
    tiny_model: Path,
) -> None:
    """The request timeout bounds the compute; a client that then reads nothing would hold
    its connection (a place under --max-connections) for as long as it stays connected."""
    async with running_server(tiny_model, send_timeout=1.0) as server:
        # One client stops reading; another does too, with a request pipelined behind its
        # stream (h11 holds that one until the stream's answer has gone out).
        pipelined = stalled_request() + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        clients = [
            await slow_reader(port_of(server), request)
            for request in (stalled_request(), pipelined)
        ]
        for stalled in clients:
            await read_until(stalled, b"data: ")
        await eventually(lambda: open_connections(server) == 0, "the stalled connections closed")
        for stalled in clients:
            with trio.fail_after(30):  # what went out before arrives, then the server's close
                while await stalled.receive_some(65536):
                    pass
            await stalled.aclose()
        reply = await sdk(server).chat.completions.create(**chat_body(max_tokens=2, temperature=0))
        assert reply.usage is not None and reply.usage.completion_tokens == 2


async def test_a_client_that_stopped_reading_does_not_hold_the_shutdown(tiny_model: Path) -> None:
    """Hypercorn's writes are shielded: without a bound, the process waited for the client
    to close its socket, a second signal notwithstanding."""
    flags = ("--served-model-name", "tiny", "--shutdown-grace", "0.5")
    async with spawned_server(tiny_model, *flags) as (process, port):
        stalled = await slow_reader(port, stalled_request())
        await read_until(stalled, b"data: ")
        process.send_signal(signal.SIGTERM)
        code = await trio.to_thread.run_sync(lambda: process.wait(timeout=30))
        assert code == 0
        await stalled.aclose()


async def test_a_second_signal_ends_the_connections_grace_too(tiny_model: Path) -> None:
    """An operator's second signal ends the drain at once, and with it the connections'
    grace after it: a whole answer computed and being written to a client that stopped
    reading held the process for the shutdown grace and Hypercorn's margin past it (here a
    minute and more), the second signal notwithstanding."""
    flags = ("--served-model-name", "tiny", "--shutdown-grace", "60")
    body = chat_body(max_tokens=200, temperature=0, logprobs=True)
    body["top_logprobs"] = 20  # an answer far larger than the socket's buffers
    async with spawned_server(tiny_model, *flags) as (process, port):
        stalled = await slow_reader(port, post_request("/v1/chat/completions", body))
        await read_until(stalled, b"HTTP/1.1 200")  # computed; its write now waits
        process.send_signal(signal.SIGTERM)
        assert process.stderr is not None
        stderr = process.stderr  # the first signal read: a second one is not merged into it
        assert await trio.to_thread.run_sync(
            lambda: any("shutting down: draining" in line for line in stderr)
        )
        process.send_signal(signal.SIGTERM)
        code = await trio.to_thread.run_sync(lambda: process.wait(timeout=30))
        assert code == 0
        await stalled.aclose()


def client_cancels(server: Any) -> float:
    registry = server.parts.metrics.registry
    labels = {"model_name": "tiny", "cause": "client"}
    value = registry.get_sample_value("mlx_nursery:request_cancelled_total", labels)
    return value or 0.0


async def test_a_client_that_leaves_while_queued_is_counted_as_a_client_cancel(
    tiny_model: Path,
) -> None:
    async with running_server(tiny_model, max_concurrency=1) as server:
        body = chat_body(max_tokens=LONG, temperature=0, stream=True)
        running = await raw_http(port_of(server), post_request("/v1/chat/completions", body))
        await read_until(running, b"data: ")  # it holds the only lane
        before = client_cancels(server)
        queued = await raw_http(
            port_of(server), post_request("/v1/chat/completions", chat_body(max_tokens=2))
        )
        await eventually(lambda: engine_of(server).statistics().queued == 1, "it waits")
        await queued.aclose()
        await eventually(lambda: client_cancels(server) == before + 1, "its cancel counted")
        await running.aclose()


async def test_timeout_while_generating(tiny_model: Path) -> None:
    async with running_server(tiny_model, max_concurrency=1, request_timeout=0.5) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            response = await http.post(
                "/v1/chat/completions", json=chat_body(max_tokens=LONG, temperature=0)
            )
            assert response.status_code == 504
            assert response.headers["x-should-retry"] == "false"
            validate_error(response.json())
            assert response.json()["error"]["code"] == "request_timeout"
            assert engine_of(server).statistics().lanes_borrowed == 0

            body = chat_body(max_tokens=LONG, temperature=0, stream=True)
            async with http.stream("POST", "/v1/chat/completions", json=body) as streamed:
                events = await sse_events(streamed)
            assert "[DONE]" not in events
            assert events[-1]["error"]["code"] == "request_timeout"
            validate_error(events[-1])

        # The SDK raises at once: it does not retry a timeout (3 attempts would be 3x the compute).
        client = sdk(server, max_retries=2)
        before = _generated(server)
        with pytest.raises(openai.InternalServerError) as raised:
            await client.chat.completions.create(**chat_body(max_tokens=LONG, temperature=0))
        assert raised.value.status_code == 504
        assert _generated(server) - before < LONG / 2
        assert engine_of(server).statistics().lanes_borrowed == 0


async def test_timeout_while_queued_costs_no_compute(tiny_model: Path) -> None:
    """The only lane is taken (by the test itself: a request holding it would time out too,
    and under load could free it before the queued one's deadline), so the request waits in
    the queue until its deadline: a 504, and not one engine step for it."""
    async with running_server(tiny_model, max_concurrency=1, request_timeout=1.0) as server:
        engine = engine_of(server)
        busy = object()
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            assert (
                await http.post("/v1/chat/completions", json=chat_body(max_tokens=2))
            ).status_code == 200
            await engine.limiter.acquire_on_behalf_of(busy)
            steps = engine.statistics().worker.steps  # type: ignore[union-attr]
            queued = await http.post("/v1/chat/completions", json=chat_body("queued", max_tokens=4))
            assert queued.status_code == 504
            assert queued.json()["error"]["code"] == "request_timeout"
            assert engine.statistics().worker.steps == steps  # type: ignore[union-attr]
            assert engine.statistics().queued == 0
            engine.limiter.release_on_behalf_of(busy)
            assert (
                await http.post("/v1/chat/completions", json=chat_body(max_tokens=2))
            ).status_code == 200


async def test_queue_full_is_503_with_retry_after(tiny_model: Path) -> None:
    async with running_server(tiny_model, max_concurrency=1, max_queue=0) as server:
        holder = await raw_http(
            port_of(server),
            post_request(
                "/v1/chat/completions", chat_body(max_tokens=LONG, temperature=0, stream=True)
            ),
        )
        await read_until(holder, b"data: ")
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            response = await http.post("/v1/chat/completions", json=chat_body(max_tokens=4))
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        validate_error(response.json())
        assert response.json()["error"]["code"] == "server_overloaded"
        await holder.aclose()
        reply = await sdk(server).chat.completions.create(**chat_body(max_tokens=2, temperature=0))
        assert reply.usage.completion_tokens == 2


async def test_idle_keep_alive_connections_are_closed(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hypercorn's keep_alive_timeout must close the idle connection (see _keepalive.py). The
    server's is 5 s; this one's is cut to 0.5 s, so that the test waits on the mechanism, not on
    the production value (which the first assertion holds)."""
    assert hypercorn_config(Settings(model=str(tiny_model))).keep_alive_timeout == 5

    def short_keep_alive(settings: Settings) -> HypercornConfig:
        config = hypercorn_config(settings)
        config.keep_alive_timeout = 0.5
        return config

    monkeypatch.setattr(server_module, "hypercorn_config", short_keep_alive)
    async with running_server(tiny_model) as server:
        connection = await raw_http(
            port_of(server), b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        await read_until(connection, b'{"status": "ok"}')
        with trio.fail_after(30):
            while await connection.receive_some(65536):
                pass


def last_event(raw: bytes) -> Any:
    """The last `data:` event of a raw chunked SSE body, decoded."""
    return json.loads(raw.rsplit(b"data: ", 1)[1].split(b"\r\n")[0].split(b"\n")[0])


async def test_sigterm_drains_then_cancels_with_an_error_event(tiny_model: Path) -> None:
    flags = ("--served-model-name", "tiny", "--shutdown-grace", "0.5")
    async with spawned_server(tiny_model, *flags) as (process, port):
        body = chat_body(max_tokens=LONG, temperature=0, stream=True)
        running = await raw_http(port, post_request("/v1/chat/completions", body))
        await read_until(running, b"data: ")
        process.send_signal(signal.SIGTERM)
        # The running stream gets a final error event once the grace period is over.
        tail = await read_until(running, b"server_shutting_down")
        assert last_event(tail)["error"]["code"] == "server_shutting_down"
        assert b"[DONE]" not in tail
        # New connections are refused; the process exits 0 after joining the engine thread.
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)
        code = await trio.to_thread.run_sync(lambda: process.wait(timeout=60))
        assert code == 0
        await running.aclose()


async def test_a_second_sigterm_ends_the_grace_and_the_drain_still_ends_cleanly(
    tiny_model: Path,
) -> None:
    flags = ("--served-model-name", "tiny", "--shutdown-grace", "600")
    async with spawned_server(tiny_model, *flags) as (process, port):
        body = chat_body(max_tokens=LONG, temperature=0, stream=True)
        running = await raw_http(port, post_request("/v1/chat/completions", body))
        await read_until(running, b"data: ")
        process.send_signal(signal.SIGTERM)
        # Signals that arrive together are delivered once: the second waits for the drain.
        assert process.stderr is not None
        stderr = process.stderr
        with trio.fail_after(30):
            await trio.to_thread.run_sync(
                lambda: next(line for line in stderr if "shutting down: draining" in line),
                abandon_on_cancel=True,
            )
        process.send_signal(signal.SIGTERM)
        tail = await read_until(running, b"server_shutting_down")  # not after 600 s
        assert last_event(tail)["error"]["code"] == "server_shutting_down"
        code = await trio.to_thread.run_sync(lambda: process.wait(timeout=60))
        assert code == 0
        await running.aclose()


async def test_sigterm_lets_a_running_request_finish_within_the_grace_period(
    tiny_model: Path,
) -> None:
    async with spawned_server(
        tiny_model, "--served-model-name", "tiny", "--shutdown-grace", "60"
    ) as (
        process,
        port,
    ):
        body = chat_body(max_tokens=400, temperature=0, stream=True)
        running = await raw_http(port, post_request("/v1/chat/completions", body))
        await read_until(running, b"data: ")
        process.send_signal(signal.SIGTERM)
        tail = await read_until(running, b"data: [DONE]")  # it ran to its end
        assert b"server_shutting_down" not in tail
        assert b'"finish_reason":"length"' in tail
        code = await trio.to_thread.run_sync(lambda: process.wait(timeout=60))
        assert code == 0
        await running.aclose()
