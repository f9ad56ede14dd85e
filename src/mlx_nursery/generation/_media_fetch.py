"""Fetching images named by http(s) URL, from the hosts the server allows (`_media_hosts`).

Before anything is fetched, the request's images are checked as its preparation would: a
model that takes no images refuses them, the image count (all sources together) is
checked, and every remote URL must be allowed; so a refused request costs no fetch.

Then its remote images are fetched on the Trio thread, inside the request's scope (a
disconnect or the deadline cancels them), at most `PER_REQUEST` at once and, server-wide,
at most `--max-image-fetches`, their bytes counted against `--max-fetched-image-bytes`
until the request is prepared (past it: a 503, `MediaFetches`). Each fetch has a timeout,
a byte cap, at most `MAX_REDIRECTS` redirects, each one's target checked as the URL was,
and connects only to addresses the allowlist allows.

A fetch that fails, for whatever reason (no connection, an error status, a redirect
refused, too large, not an image), is one error: the same code and message, naming the
part. Anything more would tell a client what answers where inside the server's network.
The server's log says what failed, with the URL cut before its query.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs
import httpcore
import trio

from ._errors import InvalidRequest, Overloaded
from ._images import ImageLimits, too_many_images
from ._media_hosts import (
    AddressRefused,
    GuardedBackend,
    allowed_entry,
    fetch_failed,
    not_allowed,
    shown,
)

log = logging.getLogger("mlx_nursery.openai")

MAX_REDIRECTS = 3
PER_REQUEST = 4
"""One request's fetches at once: a request of many slow images holds this many of the
server's `max_fetches`, not all of them."""


@attrs.frozen
class ImageRef:
    """An image part of a request: its URL, the part and the URL as errors name them."""

    url: str
    part: str
    url_param: str

    @property
    def remote(self) -> bool:
        return self.url.startswith(("http://", "https://"))


def chat_images(body: Any) -> Iterator[ImageRef]:
    """The image parts of a raw chat request body (anything not shaped as one is left to
    the request's validation)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for i, j, url in _image_parts(messages):
        yield ImageRef(
            url, f"messages[{i}].content[{j}]", f"messages[{i}].content[{j}].image_url.url"
        )


def conversation_images(messages: Any, where: str) -> Iterator[ImageRef]:
    """The image parts of chat-shaped messages (a stored conversation), all named `where`."""
    for _, _, url in _image_parts(messages):
        yield ImageRef(url, where, where)


def _image_parts(messages: Any) -> Iterator[tuple[int, int, str]]:
    """(message index, part index, url) of the image parts of chat-shaped messages, JSON as
    sent or stored; anything else is passed over."""
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            source = part.get("image_url") if isinstance(part, dict) else None
            url = source.get("url") if isinstance(source, dict) else source
            if isinstance(url, str):
                yield i, j, url


def responses_images(items: Any, previous: list[dict[str, Any]] | None) -> Iterator[ImageRef]:
    """The image parts of a Responses request's typed input, then of the stored
    conversation it continues."""
    for i, item in enumerate(items if isinstance(items, list) else ()):
        content = getattr(item, "content", None)
        for j, part in enumerate(content if isinstance(content, list) else ()):
            url = getattr(part, "image_url", None)
            if getattr(part, "type", None) == "input_image" and isinstance(url, str):
                part_param = f"input[{i}].content[{j}]"
                yield ImageRef(url, part_param, f"{part_param}.image_url")
    yield from conversation_images(previous or [], "previous_response_id")


def check_before_fetching(images: list[ImageRef], limits: ImageLimits, vision: bool) -> None:
    """Refuse, as the request's preparation would, what would make fetching pointless: any
    image for a model that takes none, more images than the limit, a remote URL of a host
    not allowed. Raises InvalidRequest naming the part."""
    if images and not vision:
        raise InvalidRequest(
            "this model does not take images (text only)",
            param=f"{images[0].part}.type",
            code="unsupported_content",
        )
    if len(images) > limits.max_images:
        raise too_many_images(len(images), limits, images[limits.max_images].part)
    for image in images:
        if image.remote and allowed_entry(image.url, limits.hosts) is None:
            raise not_allowed(image.url_param)


class MediaFetches:
    """The server's fetches together: at most `max_fetches` at once (FIFO, cancellable),
    holding at most `max_bytes` of fetched bytes until their requests are prepared."""

    def __init__(self, max_fetches: int, max_bytes: int) -> None:
        self.limiter = trio.CapacityLimiter(max_fetches)
        self.max_bytes = max_bytes
        self.held = 0
        """Fetched bytes held now."""
        self.peak = 0
        """The most ever held at once (statistics, tests)."""

    def take(self, size: int) -> None:
        """Count `size` more bytes. Raises Overloaded (503, Retry-After) past `max_bytes`."""
        if self.held + size > self.max_bytes:
            raise Overloaded(
                "the server holds as many fetched images as it may (--max-fetched-image-"
                "bytes); retry shortly, or send the image as a data: URL",
                code="server_overloaded",
            )
        self.held += size
        self.peak = max(self.peak, self.held)

    def hold(self) -> FetchHold:
        """A request's share: the bytes its fetches take, until `FetchHold.release`."""
        return FetchHold(self)


@attrs.define
class FetchHold:
    """One request's share of `MediaFetches`: the bytes its fetches took."""

    fetches: MediaFetches
    size: int = 0

    def take(self, size: int) -> None:
        self.fetches.take(size)
        self.size += size

    def release(self) -> None:
        """Give the bytes back (the request was prepared, or failed). Idempotent."""
        self.fetches.held -= self.size
        self.size = 0


async def fetch_images(
    images: Iterable[ImageRef], limits: ImageLimits, hold: FetchHold
) -> Mapping[str, bytes]:
    """The remote images of `images` (already checked: `check_before_fetching`), by URL,
    their bytes counted in `hold`. Raises InvalidRequest (`fetch_failed`) naming the part
    of the first fetch that fails, Overloaded past the server's byte limit. Cancelled with
    the calling task (its scope is the request's); what was fetched stays in `hold`."""
    wanted = {image.url: image.url_param for image in images if image.remote}
    fetched: dict[str, bytes] = {}
    if wanted:
        await _fetch_all(wanted, limits, hold, fetched)
    return fetched


async def _fetch_all(
    wanted: dict[str, str], limits: ImageLimits, held: FetchHold, out: dict[str, bytes]
) -> None:
    backend = GuardedBackend(limits.hosts, limits.allow_private)
    mine = trio.CapacityLimiter(PER_REQUEST)
    try:
        async with (
            httpcore.AsyncConnectionPool(network_backend=backend, retries=0) as pool,
            trio.open_nursery() as nursery,
        ):
            for url, param in wanted.items():
                nursery.start_soon(_fetch_one, pool, url, param, limits, held, mine, out)
    except BaseExceptionGroup as group:
        refusals, rest = group.split((InvalidRequest, Overloaded))
        if rest is not None or refusals is None:
            raise
        first: BaseException = refusals
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


async def _fetch_one(
    pool: httpcore.AsyncConnectionPool,
    url: str,
    param: str,
    limits: ImageLimits,
    held: FetchHold,
    mine: trio.CapacityLimiter,
    out: dict[str, bytes],
) -> None:
    async with mine, held.fetches.limiter:
        try:
            out[url] = await _download(pool, url, limits, held)
        except _Failed as failure:
            log.info("image fetch failed: %s: %s", shown(url), failure)
            raise fetch_failed(param) from None


class _Failed(Exception):
    """Why a fetch failed: for the log only."""


async def _download(
    pool: httpcore.AsyncConnectionPool, url: str, limits: ImageLimits, held: FetchHold
) -> bytes:
    timeout = limits.fetch_timeout
    extensions: dict[str, Any] = {
        "timeout": dict.fromkeys(("connect", "read", "write", "pool"), timeout)
    }
    target = url
    try:
        for _ in range(MAX_REDIRECTS + 1):
            async with pool.stream("GET", target, extensions=extensions) as response:
                if response.status in (301, 302, 303, 307, 308):
                    location = _header(response, b"location")
                    target = urllib.parse.urljoin(target, location)
                    if allowed_entry(target, limits.hosts) is None:
                        raise _Failed(f"a redirect to {shown(target)}, not allowed")
                    continue
                if response.status != 200:
                    raise _Failed(f"HTTP {response.status}")
                declared = _header(response, b"content-length")
                if declared.isdigit() and int(declared) > limits.max_bytes:
                    raise _Failed(f"{declared} bytes, past the limit")
                data = bytearray()
                async for chunk in response.aiter_stream():
                    if len(data) + len(chunk) > limits.max_bytes:
                        raise _Failed("past the byte limit")
                    held.take(len(chunk))
                    data += chunk
                return bytes(data)
        raise _Failed("too many redirects")
    except AddressRefused as exc:
        raise _Failed(str(exc)) from None
    except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
        raise _Failed(f"{type(exc).__name__}: {exc}") from None
    except (httpcore.UnsupportedProtocol, ValueError) as exc:  # a URL httpcore cannot take
        raise _Failed(f"{type(exc).__name__}: {exc}") from None


def _header(response: httpcore.Response, name: bytes) -> str:
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return ""
