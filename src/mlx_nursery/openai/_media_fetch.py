"""Fetching images named by http(s) URL, for hosts the server allows (`--allowed-media-domains`).

Fetched on the Trio thread, before the request is prepared, all of a request's images at
once and inside the request's scope: a disconnect or the request's deadline cancels the
fetch like any other part of the request. Each fetch has a timeout, a byte cap (read no
further than the limit) and follows redirects only within the same host; anything else
is a 400 naming the part. The prepared request then decodes the fetched bytes as it does a
data: URL's (`_images.load_image`).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import trio

from ._errors import InvalidRequest
from ._images import ImageLimits, too_large

MAX_REDIRECTS = 3


def is_remote(url: Any) -> bool:
    return isinstance(url, str) and url.startswith(("http://", "https://"))


def host_allowed(url: str, limits: ImageLimits) -> bool:
    host = urllib.parse.urlsplit(url).hostname
    return host is not None and host.lower() in limits.domains


def chat_image_urls(body: Any) -> Iterator[tuple[str, str]]:
    """(url, param) of the http(s) image parts of a raw chat request body (anything not
    shaped as one is left to the request's validation)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for i, j, url in _remote_parts(messages):
        yield url, f"messages[{i}].content[{j}].image_url.url"


def conversation_image_urls(messages: Any, where: str) -> Iterator[tuple[str, str]]:
    """(url, param) of the http(s) images of chat-shaped messages (a stored conversation)."""
    for _, _, url in _remote_parts(messages):
        yield url, where


def _remote_parts(messages: Any) -> Iterator[tuple[int, int, str]]:
    """(message index, part index, url) of the http(s) image parts of chat-shaped messages,
    JSON as sent or stored; anything else is passed over."""
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            source = part.get("image_url") if isinstance(part, dict) else None
            url = source.get("url") if isinstance(source, dict) else source
            if isinstance(url, str) and is_remote(url):
                yield i, j, url


def responses_image_urls(
    items: Any, previous: list[dict[str, Any]] | None
) -> Iterator[tuple[str, str]]:
    """(url, param) of the http(s) images of a Responses request's typed input, then of the
    stored conversation it continues."""
    for i, item in enumerate(items if isinstance(items, list) else ()):
        content = getattr(item, "content", None)
        for j, part in enumerate(content if isinstance(content, list) else ()):
            url = getattr(part, "image_url", None)
            image = getattr(part, "type", None) == "input_image"
            if image and isinstance(url, str) and is_remote(url):
                yield url, f"input[{i}].content[{j}].image_url"
    yield from conversation_image_urls(previous or [], "previous_response_id")


async def fetch_images(urls: list[tuple[str, str]], limits: ImageLimits) -> Mapping[str, bytes]:
    """Fetch every allowed http(s) URL at once; URLs of hosts not allowed are left out (the
    request's preparation refuses them by name). Raises InvalidRequest naming the part of
    the first fetch that fails. Cancelled with the calling task (its scope is the request's)."""
    wanted = {url: param for url, param in urls if host_allowed(url, limits)}
    fetched: dict[str, bytes] = {}
    if not wanted:
        return fetched
    timeout = httpx.Timeout(limits.fetch_timeout)
    try:
        async with (
            httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
            trio.open_nursery() as nursery,
        ):
            for url, param in wanted.items():
                nursery.start_soon(_fetch_into, client, url, param, limits, fetched)
    except BaseExceptionGroup as group:
        refusals, rest = group.split(InvalidRequest)
        if rest is not None or refusals is None:
            raise
        first: BaseException = refusals
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return fetched


async def _fetch_into(
    client: httpx.AsyncClient, url: str, param: str, limits: ImageLimits, out: dict[str, bytes]
) -> None:
    host = urllib.parse.urlsplit(url).hostname
    target = url
    try:
        for _ in range(MAX_REDIRECTS + 1):
            async with client.stream("GET", target) as response:
                if response.is_redirect:
                    location = response.headers.get("location", "")
                    target = urllib.parse.urljoin(target, location)
                    if urllib.parse.urlsplit(target).hostname != host or not is_remote(target):
                        raise _failed(param, "it redirects to another host")
                    continue
                if response.status_code != 200:
                    raise _failed(param, f"HTTP {response.status_code}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
                    raise too_large(int(declared), limits, param)
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > limits.max_bytes:
                        raise too_large(len(data), limits, param)
                out[url] = bytes(data)
                return
        raise _failed(param, "too many redirects")
    except httpx.TimeoutException:
        raise _failed(param, f"no answer within {limits.fetch_timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise _failed(param, type(exc).__name__) from None


def _failed(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"the image could not be fetched: {why}", param=param, code="invalid_image"
    )
