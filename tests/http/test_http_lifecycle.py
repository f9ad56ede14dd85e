"""The HTTP job lifecycle over a real server: a job ends with its request, whatever point the
request ends at; a draining server refuses new jobs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio

from mlx_nursery.generation import Prepared
from mlx_nursery.serving import Job, Jobs, Preparation
from tests.http_helpers import (
    ThreadedServer,
    borrowed,
    chat_body,
    engine_of,
    eventually,
    hosted_of,
    port_of,
    post_request,
    raw_http,
    read_until,
    running_server,
    server_thread,
    validate_error,
)

T = TypeVar("T")

LONG = 3000  # tokens a request would run to if nothing stopped it (no EOS at T=0)

STREAMS = {
    "/v1/chat/completions": chat_body(max_tokens=LONG, temperature=0, stream=True),
    "/v1/completions": {
        "model": "tiny",
        "prompt": "Once",
        "max_tokens": LONG,
        "temperature": 0,
        "stream": True,
    },
    "/v1/responses": {
        "model": "tiny",
        "input": "Tell a tale.",
        "max_output_tokens": LONG,
        "temperature": 0,
        "stream": True,
    },
}


class HeldStart:
    """Wraps `Jobs.start`: once the job holds its lane, the route is held (shielded) until
    the client's disconnect has cancelled the request, then goes on. The response head is
    then never sent and the body generator never starts: the request ends at the next
    checkpoint, in Hypercorn's send of the head."""

    def __init__(self, jobs: Jobs) -> None:
        self._start = jobs.start
        self.entered = trio.Event()
        self.job: Job | None = None

    async def __call__(self, prepared: Prepared, *rest: Any) -> Job:
        job = await self._start(prepared, *rest)
        self.job = job
        self.entered.set()
        limit = trio.current_time() + 60
        # The request's scope is cancelled once Quart-Trio has seen the disconnect.
        while trio.current_effective_deadline() != -math.inf:
            if trio.current_time() > limit:
                raise AssertionError("the disconnect never reached the request")
            with trio.CancelScope(shield=True):
                await trio.sleep(0.005)
        return job


@pytest.mark.parametrize("path", sorted(STREAMS))
async def test_a_disconnect_before_the_first_body_byte_stops_the_job(
    tiny_model: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_server(tiny_model, max_concurrency=1) as server:
        engine, jobs = engine_of(server), hosted_of(server).jobs
        assert jobs is not None
        held = HeldStart(jobs)
        monkeypatch.setattr(jobs, "start", held)
        connection = await raw_http(port_of(server), post_request(path, STREAMS[path]))
        await held.entered.wait()
        await connection.aclose()

        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane came back")
        assert held.job is not None
        # Cancelled by the request's end (not by its deadline, nor by the engine giving up
        # on a consumer that stopped reading, which is how the compute used to stop here).
        assert held.job.scope.cancel_called and held.job.reason == "client"
        assert engine.statistics().worker.generated_tokens < LONG / 2  # type: ignore[union-attr]


class HeldPrepare:
    """Wraps `Preparation.prepare`: a prepared request waits for `resume` before it goes on
    to start its job."""

    def __init__(self, preparation: Preparation) -> None:
        self._prepare = preparation.prepare
        self.entered = trio.Event()
        self.resume = trio.Event()

    async def __call__(self, work: Callable[[], T], deadline: float) -> T:
        prepared = await self._prepare(work, deadline)
        self.entered.set()
        await self.resume.wait()
        return prepared


async def test_a_job_started_during_drain_is_refused(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_server(tiny_model, max_concurrency=2) as server:
        service = server.service
        running = await raw_http(
            port_of(server),
            post_request("/v1/chat/completions", chat_body(max_tokens=64, stream=True)),
        )
        await read_until(running, b"data: ")  # a job is running: the drain will wait for it
        held = HeldPrepare(server.parts.preparation)
        monkeypatch.setattr(server.parts.preparation, "prepare", held)
        drained = trio.Event()

        async def drain() -> None:
            await service.drain(60)
            drained.set()

        async def request(http: httpx.AsyncClient, responses: list[httpx.Response]) -> None:
            responses.append(await http.post("/v1/chat/completions", json=chat_body(max_tokens=4)))

        late: list[httpx.Response] = []
        async with trio.open_nursery() as draining:
            http = httpx.AsyncClient(base_url=server.base_url)
            async with http, trio.open_nursery() as requesting:
                requesting.start_soon(request, http, late)
                await held.entered.wait()  # past the readiness check, not yet started
                draining.start_soon(drain)
                await eventually(lambda: service.state == "draining", "the drain began")
                held.resume.set()

            assert late[0].status_code == 503
            validate_error(late[0].json())
            assert late[0].json()["error"]["code"] == "server_shutting_down"
            # The running job finishes, and the drain ends with it, not at the end of its grace.
            assert b"data: [DONE]" in await read_until(running, b"data: [DONE]")
            with trio.fail_after(30):
                await drained.wait()
        await running.aclose()


@pytest.fixture(scope="module")
def one_lane_half_a_second(tiny_model: Path) -> Iterator[ThreadedServer]:
    with server_thread(tiny_model, max_concurrency=1, request_timeout=0.5) as served:
        yield served


@pytest.mark.parametrize("path", sorted(STREAMS))
async def test_a_non_streaming_job_error_goes_to_the_one_handler(
    one_lane_half_a_second: ThreadedServer, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A job's error in a JSON response is raised to app.py's handler, as every other error:
    the envelope and its headers, and the handler's log line with the request id."""
    body = {**STREAMS[path], "stream": False}
    async with (
        borrowed(one_lane_half_a_second) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        # The lane the previous case's request held is back: this one runs, it does not queue.
        engine = engine_of(server)
        await eventually(lambda: engine.statistics().lanes_borrowed == 0, "the lane is free")
        response = await http.post(path, json=body, headers={"x-request-id": "req-late"})
    assert response.status_code == 504
    assert response.headers["x-should-retry"] == "false"
    assert response.headers["x-request-id"] == "req-late"
    validate_error(response.json())
    assert response.json()["error"]["code"] == "request_timeout"
    assert any(r.getMessage().startswith("request req-late failed:") for r in caplog.records), (
        "the handler did not see the error"
    )
