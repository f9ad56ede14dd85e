"""Images fetched by URL (`--allowed-media-domains`), as an attacker would use them: real
image servers on 127.0.0.1 (Hypercorn), the real server, httpx.

What is refused costs no fetch (too many images, a model without vision, a host or port
not listed); every fetch that fails looks the same to the client (no port-scan oracle);
redirects and resolved addresses are checked as the URL is; fetches are bounded server-wide.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import hypercorn
import hypercorn.trio
import pytest
import trio

from mlx_nursery.generation import parse_media_hosts
from mlx_nursery.generation._media_hosts import allowed_entry
from mlx_nursery.settings import Settings, SettingsError
from tests.http.test_http_vision import data_url, image_chat, png, responses_input
from tests.http_helpers import eventually, running_server, sdk, validate_error

CHAT = "/v1/chat/completions"
URL_PARAM = "messages[0].content[0].image_url.url"


@attrs.define
class ImageHost:
    """A real HTTP server of images on 127.0.0.1 (see `image_host`)."""

    base: str = ""
    asked: list[str] = attrs.Factory(list)
    """Paths asked for, in order."""
    in_flight: int = 0
    most_in_flight: int = 0
    gate: trio.Event = attrs.Factory(trio.Event)
    """/gate/... paths wait for it, then serve /cat.png."""

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])


@asynccontextmanager
async def image_host(
    served: dict[str, bytes], redirects: dict[str, str] | None = None
) -> AsyncIterator[ImageHost]:
    """Serves `served` (path -> bytes; anything else is a 404), `redirects` (path -> 302
    Location), /stall (never answers) and /gate/... (`ImageHost.gate`)."""
    host = ImageHost()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        path = scope["path"]
        host.asked.append(path)
        host.in_flight += 1
        host.most_in_flight = max(host.most_in_flight, host.in_flight)
        try:
            headers: list[tuple[bytes, bytes]] = []
            body, status = b"", 404
            if path.startswith("/gate/"):
                await host.gate.wait()
                path = "/cat.png"
            if path in served:
                body, status = served[path], 200
            elif path in (redirects or {}):
                status, headers = 302, [(b"location", (redirects or {})[path].encode())]
            elif path == "/stall":
                await trio.sleep_forever()
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        finally:
            host.in_flight -= 1

    config = hypercorn.Config()
    config.bind = ["127.0.0.1:0"]
    config.loglevel = "WARNING"
    config.graceful_timeout = 0.1  # /stall never ends by itself
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: hypercorn.trio.serve(
                app,  # type: ignore[arg-type]
                config,
                shutdown_trigger=stop.wait,
                task_status=task_status,
            )
        )
        host.base = binds[0]
        try:
            yield host
        finally:
            stop.set()


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def error_of(reply: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    validate_error(reply.json())
    error: dict[str, Any] = reply.json()["error"]
    return error


async def test_allowed_hosts_and_ports_are_fetched_and_every_failure_looks_alike(
    tiny_vlm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fetch's failures used to differ (connect error, HTTP 404, too large, no answer, not
    an image): a port-scan oracle. Now they are one error; the log says which, without the
    URL's query. Only listed host:port pairs are fetched (a bare host: its default ports),
    and a redirect is followed only to a listed one: not to another port of the same host."""
    cat, big = png(1), png(2, (200, 200))
    dead = closed_port()
    async with (
        image_host({}) as other,
        image_host(
            {"/cat.png": cat, "/big.png": big, "/text.png": b"not an image at all"},
            redirects={"/moved": "/cat.png", "/to-other-port": f"{other.base}/cat.png"},
        ) as host,
    ):
        allowed = f"127.0.0.1:{host.port}, 127.0.0.1:{dead}, example.invalid"
        async with (
            running_server(
                tiny_vlm,
                skip_warmup=True,
                allowed_media_domains=allowed,
                image_fetch_timeout=0.5,
                max_image_bytes=len(cat) + 100,
            ) as server,
            httpx.AsyncClient(base_url=server.base_url) as http,
        ):

            async def ask(url: str) -> httpx.Response:
                return await http.post(CHAT, json=image_chat(url))

            inline = (await ask(data_url(cat))).json()["choices"]
            assert (await ask(f"{host.base}/cat.png")).json()["choices"] == inline
            assert (await ask(f"{host.base}/moved")).json()["choices"] == inline

            caplog.set_level(logging.INFO, logger="mlx_nursery.openai")
            failures = [
                f"{host.base}/missing.png?secret=s3cr3t",  # 404
                f"{host.base}/big.png",  # past the byte limit
                f"{host.base}/stall",  # no answer within the timeout
                f"{host.base}/text.png",  # fetched, not an image
                f"{host.base}/to-other-port",  # a redirect to a port not listed
                f"http://127.0.0.1:{dead}/cat.png",  # nothing listens
            ]
            seen = set()
            for url in failures:
                error = error_of(await ask(url))
                assert error["param"] == URL_PARAM
                seen.add((error["code"], error["message"]))
            assert len(seen) == 1 and seen.pop()[0] == "failed_to_download_image"
            logged = "\n".join(r.getMessage() for r in caplog.records)
            assert "/missing.png: HTTP 404" in logged and "s3cr3t" not in logged
            assert other.asked == []  # the redirect to another port was not followed

            # Not listed: refused by the URL alone, nothing asked.
            asked = len(host.asked)
            for url in (
                f"{host.base.replace('127.0.0.1', 'localhost')}/cat.png",  # another name
                f"{other.base}/cat.png",  # another port of a listed host
                "https://example.invalid:8443/cat.png",  # a bare host: its default ports only
            ):
                error = error_of(await ask(url))
                assert "--allowed-media-domains" in error["message"], url
            assert len(host.asked) == asked and other.asked == []

            response = await sdk(server).responses.create(
                model="tiny",
                input=responses_input(f"{host.base}/cat.png"),  # type: ignore[arg-type]
                max_output_tokens=8,
                temperature=0,
            )
            assert response.output_text == inline[0]["message"]["content"]


async def test_images_are_counted_and_the_model_checked_before_any_fetch(
    tiny_vlm: Path, tiny_model: Path
) -> None:
    """Every URL of a request used to be fetched before the image count was checked (200
    fetched, refused at the 17th), and before a text-only model said it takes no images."""
    async with (
        image_host({"/cat.png": png(1)}) as host,
        running_server(
            None,
            model=(f"{tiny_vlm}=tiny", f"{tiny_model}=text"),
            max_loaded_models=2,
            skip_warmup=True,
            allowed_media_domains=f"127.0.0.1:{host.port}",
        ) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        urls = [f"{host.base}/cat.png?n={n}" for n in range(200)]
        error = error_of(await http.post(CHAT, json=image_chat(*urls)))
        assert (error["code"], error["param"]) == (
            "image_too_large",
            "messages[0].content[16]",
        )
        text_only = image_chat(f"{host.base}/cat.png") | {"model": "text"}
        error = error_of(await http.post(CHAT, json=text_only))
        assert "does not take images" in error["message"]
        messages = {
            "model": "tiny",
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look."},
                        *[
                            {"type": "image", "source": {"type": "url", "url": url}}
                            for url in urls[:17]
                        ],
                    ],
                }
            ],
        }
        refused = await http.post("/v1/messages", json=messages)
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "invalid_request_error"
        assert host.asked == []
        fine = await http.post(CHAT, json=image_chat(f"{host.base}/cat.png"))
        assert fine.status_code == 200 and host.asked == ["/cat.png"]


async def test_fetches_are_bounded_server_wide_in_number_and_bytes(tiny_vlm: Path) -> None:
    """No bound held the fetches of all requests together (one request took the server to
    1.65 GB). At most --max-image-fetches run at once (here 2, for two requests of three
    images), and the bytes fetched and not yet prepared stay under --max-fetched-image-bytes
    (past it: 503, and nothing stays held)."""
    cat = png(1)
    async with image_host({"/cat.png": cat, "/dog.png": png(2)}) as host:
        async with (
            running_server(
                tiny_vlm,
                skip_warmup=True,
                allowed_media_domains=f"127.0.0.1:{host.port}",
                max_image_fetches=2,
            ) as server,
            httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
        ):
            replies: list[httpx.Response] = []

            async def gated(first: int) -> None:
                urls = [f"{host.base}/gate/{n}" for n in range(first, first + 3)]
                replies.append(await http.post(CHAT, json=image_chat(*urls)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(gated, 0)
                nursery.start_soon(gated, 3)
                await eventually(lambda: host.in_flight == 2, "two fetches waiting")
                host.gate.set()
            assert [r.status_code for r in replies] == [200, 200]
            assert host.most_in_flight == 2 and len(host.asked) == 6

        limit = len(cat) * 3 // 2
        async with (
            running_server(
                tiny_vlm,
                skip_warmup=True,
                allowed_media_domains=f"127.0.0.1:{host.port}",
                max_fetched_image_bytes=limit,
            ) as server,
            httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
        ):
            fetches = server.parts.preparation.fetches
            one = await http.post(CHAT, json=image_chat(f"{host.base}/cat.png"))
            assert one.status_code == 200 and fetches.held == 0
            urls = (f"{host.base}/cat.png", f"{host.base}/dog.png")
            two = await http.post(CHAT, json=image_chat(*urls))
            assert (
                error_of(two, 503)["code"] == "server_overloaded" and "Retry-After" in two.headers
            )
            assert fetches.held == 0 and fetches.peak <= limit


@attrs.frozen
class Resolver(trio.abc.HostnameResolver):
    """Resolves `names` to 127.0.0.1 (a name the attacker controls, pointed inside the
    server's network after the check: DNS rebinding), every other name as usual."""

    names: frozenset[bytes]

    async def getaddrinfo(
        self, host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> Any:
        if host in self.names:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return await trio.to_thread.run_sync(
            socket.getaddrinfo, host, port, family, type, proto, flags
        )

    async def getnameinfo(self, sockaddr: Any, flags: int) -> Any:
        return await trio.to_thread.run_sync(socket.getnameinfo, sockaddr, flags)


async def test_names_that_resolve_inside_the_network_are_refused_unless_allowed(
    tiny_vlm: Path,
) -> None:
    """The allowlist matched names only: a listed name resolving to a private address
    reached inside the server's network. The address is now checked at connect time (and
    connected to as checked); an IP or localhost entry allows its own address, and
    --allow-private-media-addresses allows any."""
    previous = trio.socket.set_custom_hostname_resolver(Resolver(frozenset({b"images.test"})))
    try:
        async with image_host({"/cat.png": png(1)}) as host:
            port = host.port
            entries = f"images.test:{port}, localhost:{port}"
            for allow_private, status in ((False, 400), (True, 200)):
                async with (
                    running_server(
                        tiny_vlm,
                        skip_warmup=True,
                        allowed_media_domains=entries,
                        allow_private_media_addresses=allow_private,
                    ) as server,
                    httpx.AsyncClient(base_url=server.base_url) as http,
                ):
                    asked = len(host.asked)
                    rebound = await http.post(
                        CHAT, json=image_chat(f"http://images.test:{port}/cat.png")
                    )
                    assert rebound.status_code == status, rebound.text
                    if status == 400:
                        assert error_of(rebound)["code"] == "failed_to_download_image"
                        assert len(host.asked) == asked  # refused before connecting
                    # `localhost:PORT` used never to match; it allows loopback itself.
                    local = await http.post(
                        CHAT, json=image_chat(f"http://localhost:{port}/cat.png")
                    )
                    assert local.status_code == 200, local.text
    finally:
        trio.socket.set_custom_hostname_resolver(previous)


def test_allowlist_entries_are_hosts_or_host_ports() -> None:
    hosts = parse_media_hosts("Images.Example.com, 10.0.0.5:8080, [::1]:9000, localhost:9550")
    allowed = [
        "https://images.example.com/a.png",
        "http://IMAGES.example.com/a.png",
        "http://10.0.0.5:8080/a.png",
        "https://10.0.0.5:8080/a.png",
        "http://[::1]:9000/a.png",
        "http://localhost:9550/a.png",
    ]
    refused = [
        "https://images.example.com:8443/a.png",  # a bare host: its scheme's default port
        "http://images.example.com:443/a.png",
        "http://10.0.0.5/a.png",
        "http://localhost/a.png",
        "http://[::1]:9001/a.png",
        "ftp://images.example.com/a.png",
        "http://images.example.com:x/a.png",
    ]
    assert all(allowed_entry(url, hosts) is not None for url in allowed)
    assert [url for url in refused if allowed_entry(url, hosts) is not None] == []
    for bad in ("host:port", "user@host", "host/path", "host:0", "http://host", "a, :80"):
        with pytest.raises(SettingsError, match="allowed_media_domains"):
            Settings(allowed_media_domains=bad)
