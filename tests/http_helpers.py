"""Real servers for HTTP tests: Hypercorn on 127.0.0.1:0 in the test's nursery; schema checks."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import attrs
import httpx
import jsonschema
import openai
import trio
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from mlx_nursery.engine import Engine
from mlx_nursery.server import Running, serve
from mlx_nursery.serving._slots import Hosted
from mlx_nursery.settings import Settings
from mlx_nursery.testing import extra_processors as testing_processors
from mlx_nursery.testing import harness

SPEC = Path(__file__).parent / "reference" / "openai-openapi.yaml"
SPEC_URI = "urn:openai-openapi"


def _nullable_to_json_schema(node: Any) -> Any:
    """The spec still uses OpenAPI 3.0's `nullable: true` in places; JSON Schema spells it null."""
    if isinstance(node, list):
        return [_nullable_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _nullable_to_json_schema(v) for k, v in node.items()}
    if node.pop("nullable", False) is True:
        return {"anyOf": [node, {"type": "null"}]}
    return node


@cache
def openapi_spec() -> Any:
    """The official OpenAPI spec as parsed from its YAML (about 2 s of parsing: once a session).
    Shared: read it, never change it."""
    return yaml.load(SPEC.read_text("utf-8"), Loader=yaml.CSafeLoader)


@cache
def _registry() -> Registry:
    spec = _nullable_to_json_schema(openapi_spec())
    registry: Registry = Registry().with_resource(
        SPEC_URI, Resource.from_contents(spec, DRAFT202012)
    )
    return registry


def validate(instance: Any, schema_name: str) -> None:
    """Validate against `#/components/schemas/<schema_name>` of the official OpenAPI spec."""
    schema = {"$ref": f"{SPEC_URI}#/components/schemas/{schema_name}"}
    validator = jsonschema.Draft202012Validator(schema, registry=_registry())
    errors = sorted(validator.iter_errors(instance), key=lambda e: e.path)
    assert not errors, f"{schema_name}: " + "; ".join(
        f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]
    )


def validate_error(body: Any) -> None:
    validate(body, "ErrorResponse")
    assert set(body["error"]) == {"message", "type", "param", "code"}


@asynccontextmanager
async def running_server(
    model_dir: Path | None,
    /,
    *,
    extra_processors: Any = None,
    harnessed: bool = True,
    **settings: Any,
) -> AsyncIterator[Running]:
    """Serve `model` until the block ends, then shut down as SIGTERM would and join everything.

    `model_dir` None serves the built-in default model, or the models `settings` name. The
    server runs with the testing package's harness, as `mlx-nursery serve` does (unless
    not `harnessed`), and with `extra_processors` (`mlx_nursery.testing.extra_processors`)
    when given. Its warm-up is minimal unless `settings` say otherwise: its first phase
    runs (the fast path), the rest of its budget is none (tests/engine/test_warmup.py and
    the engine's startup test run every phase)."""
    defaults: dict[str, Any] = {
        "shutdown_grace": 5.0,
        "responses_db": ":memory:",
        "port": 0,
        "warmup_budget": 0.0,
    }
    if model_dir is not None:
        defaults.update(model=str(model_dir), served_model_name="tiny")
    config = Settings(**{**defaults, **settings})
    extensions = [harness(config)] if harnessed else []
    if extra_processors is not None:
        extensions.append(testing_processors(extra_processors))
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        running: Running = await nursery.start(
            lambda task_status: serve(
                config,
                shutdown=shutdown,
                handle_signals=False,
                extensions=extensions,
                task_status=task_status,
            )
        )
        try:
            yield running
        finally:
            for client in _clients.pop(id(running), []):
                await client.close()
            shutdown.set()


@attrs.frozen
class ThreadedServer:
    """A server `server_thread` runs: the server, and the thread its Trio run is on."""

    running: Running
    trio_thread: int


@contextmanager
def server_thread(model_dir: Path | None, /, **settings: Any) -> Iterator[ThreadedServer]:
    """`running_server` on a thread of its own (a Trio run of its own), for a module-scoped
    fixture: one server for many tests, each test in its own Trio run."""
    started: queue.Queue[Running | BaseException] = queue.Queue()
    stop: list[tuple[trio.lowlevel.TrioToken, trio.Event]] = []

    async def host() -> None:
        stopped = trio.Event()
        async with running_server(model_dir, **settings) as running:
            stop.append((trio.lowlevel.current_trio_token(), stopped))
            started.put(running)
            await stopped.wait()

    def run() -> None:
        try:
            trio.run(host)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            started.put(exc)

    thread = threading.Thread(target=run, name="test-server")
    thread.start()
    running = started.get(timeout=120)
    if isinstance(running, BaseException):
        raise running
    assert thread.ident is not None
    try:
        yield ThreadedServer(running, thread.ident)
    finally:
        token, stopped = stop[0]
        trio.from_thread.run_sync(stopped.set, trio_token=token)
        thread.join(60)
        assert not thread.is_alive()
    if not started.empty():  # the server's run failed on the way out
        failure = started.get()
        assert isinstance(failure, BaseException)
        raise failure


@asynccontextmanager
async def borrowed(server: ThreadedServer) -> AsyncIterator[Running]:
    """A server `server_thread` runs for a module, lent to one test as `running_server`
    gives one: the SDK clients `sdk` makes for it in the block are closed when it ends, in
    the test's own Trio run (the server outlives it). Its counters are the module's so far:
    a test compares them with their values at its start."""
    try:
        yield server.running
    finally:
        for client in _clients.pop(id(server.running), []):
            await client.close()


def hosted_of(running: Running) -> Hosted:
    """The first loaded text-generation model of `running` (a server of one model: its model)."""
    models = running.service.models
    assert models is not None
    hosted = next((h for h in models.loaded() if isinstance(h, Hosted)), None)
    assert hosted is not None, "no generation model is loaded"
    return hosted


def engine_of(running: Running) -> Engine:
    engine = hosted_of(running).engine
    assert isinstance(engine, Engine)
    return engine


_clients: dict[int, list[openai.AsyncOpenAI]] = {}


def sdk(running: Running, **kwargs: Any) -> openai.AsyncOpenAI:
    """The official SDK's async client for `running`; closed when the server's block ends."""
    kwargs.setdefault("api_key", "unused")
    client = openai.AsyncOpenAI(base_url=running.base_url + "/v1", **kwargs)
    _clients.setdefault(id(running), []).append(client)
    return client


def chat_body(content: str = "Say something.", **fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], **fields}


async def sse_events(response: httpx.Response) -> list[Any]:
    """Every `data:` payload of an SSE response, JSON-decoded except `[DONE]`; checks framing."""
    raw = (await response.aread()).decode()
    assert raw.endswith("\n\n"), "every event, the last included, must end with a blank line"
    events: list[Any] = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def raw_http(port: int, request: bytes) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    return stream


def post_request(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def read_until(stream: trio.SocketStream, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, f"connection closed before {marker!r}; got {data[-300:]!r}"
        data += chunk
    return data


def port_of(running: Running) -> int:
    return int(running.base_url.rsplit(":", 1)[1])


async def eventually(predicate: Any, what: str, limit: float = 60.0) -> None:
    """Wait for a condition another thread or task will make true (polls; fails after `limit`)."""
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - the condition lives on another thread
            await trio.sleep(0.005)


class ForcedScript:
    """A logits processor that makes the model emit exactly `tokens`, then its EOS.

    The real tokenizer, engine, detokenizer and streaming path all run; only the choice of
    each next token is dictated. One instance per request."""

    def __init__(self, tokens: list[int], eos: int | None) -> None:
        """`eos` None: after the script, the model chooses freely (a forced prefix)."""
        self._script = [*tokens, eos] if eos is not None else tokens
        self._free_after = None if eos is not None else len(tokens)
        self._prompt_length: int | None = None

    def __call__(self, context: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self._prompt_length is None:  # the position follows the context, as replays need
            self._prompt_length = int(context.size)
        step = int(context.size) - self._prompt_length
        if self._free_after is not None and step >= self._free_after:
            return logits
        token = self._script[min(step, len(self._script) - 1)]
        mask = mx.arange(logits.shape[-1]) == token
        return mx.where(mask, mx.zeros_like(logits), mx.full(logits.shape, -1e9, logits.dtype))


def scripted(
    texts_by_user: dict[str, str], tokenizer_path: Path, *, then_free: bool = False
) -> Any:
    """extra_processors for running_server: a request whose `user` names a script emits it
    (then its EOS; with `then_free`, whatever the model chooses after it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(eos, int), "the tokenizer knows <|im_end|>"

    def processors(body: Any) -> tuple[Any, ...]:
        text = texts_by_user.get(body.get("user") or body.get("safety_identifier") or "")
        if text is None:
            return ()
        return (
            ForcedScript(
                tokenizer.encode(text, add_special_tokens=False), None if then_free else eos
            ),
        )

    return processors


@asynccontextmanager
async def spawned_server(
    model: Path, *flags: str
) -> AsyncIterator[tuple[subprocess.Popen[str], int]]:
    """`mlx-nursery serve` as a real process (for signals); killed on exit if still running."""
    process, port = await trio.to_thread.run_sync(lambda: _spawn_server(model, *flags))
    try:
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
        await trio.to_thread.run_sync(process.wait)
        assert process.stderr is not None
        process.stderr.close()


def _spawn_server(model: Path, *flags: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlx_nursery",
            "serve",
            "--model",
            str(model),
            "--port",
            "0",
            *flags,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    port, loaded = None, False
    for line in process.stderr:
        if match := re.search(r"Running on http://127\.0\.0\.1:(\d+)", line):
            port = int(match.group(1))
        loaded = loaded or "serving tiny" in line
        if port and loaded:
            break
    assert port is not None, "the server did not start"
    return process, port
