"""Where the server may fetch media from: the allowed hosts and ports, and the addresses
their names may resolve to.

`--allowed-media-domains` lists `host` or `host:port` entries (an IPv6 address in
brackets: `[::1]:8080`). A bare host allows the default port of the URL's scheme (80 for
http, 443 for https) only; `host:port` that port only, over either scheme. Every URL is
checked, each redirect's target included.

A name an entry allows may still resolve to an address inside the server's network (a
private, loopback, link-local or other non-global address: DNS rebinding, or a wildcard
DNS name that points anywhere). So each connection resolves the name itself, checks every
address, and connects to a checked address: a name that resolves to a non-global address
is refused, unless `--allow-private-media-addresses` is set, or the entry names the address
itself (an IP address entry allows that address; a `localhost` entry, loopback addresses).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable

import attrs
import httpcore
import trio

from ._errors import InvalidRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_PORTS = {"http": 80, "https": 443}


@attrs.frozen
class MediaHost:
    """An entry of `--allowed-media-domains`."""

    host: str
    """Lowercase; an IPv6 address without its brackets."""
    port: int | None = None
    """None: the scheme's default port only."""

    def allows(self, host: str, port: int, scheme: str) -> bool:
        wanted = DEFAULT_PORTS[scheme] if self.port is None else self.port
        return host == self.host and port == wanted

    def allows_address(self, address: IPAddress) -> bool:
        """Whether this entry names `address` itself (an IP entry, or localhost's loopback)."""
        if self.host == "localhost":
            return address.is_loopback
        try:
            return _plain(ipaddress.ip_address(self.host)) == address
        except ValueError:
            return False

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse_media_hosts(value: str | None) -> tuple[MediaHost, ...]:
    """The entries of a comma-separated `--allowed-media-domains`. Raises ValueError naming
    an entry that is not `host` or `host:port`."""
    hosts = []
    for entry in (e.strip() for e in (value or "").split(",")):
        if not entry:
            continue
        try:
            parts = urllib.parse.urlsplit(f"//{entry}")
            host, port = parts.hostname, parts.port
            plain = parts.netloc == entry and not parts.username and parts.password is None
        except ValueError:
            host, port, plain = None, None, False
        if not host or not plain or (port is not None and not 1 <= port <= 65535):
            raise ValueError(f"{entry!r} is not a host or host:port")
        hosts.append(MediaHost(host.lower(), port))
    return tuple(hosts)


def allowed_entry(url: str, hosts: Iterable[MediaHost]) -> MediaHost | None:
    """The entry that allows fetching `url` (None: no entry does, or it is not http(s))."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname
        port = parts.port if parts.port is not None else DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port that is not a number
        return None
    if scheme not in DEFAULT_PORTS or host is None or port is None:
        return None
    return next((entry for entry in hosts if entry.allows(host.lower(), port, scheme)), None)


def not_allowed(param: str) -> InvalidRequest:
    """The 400 for an http(s) image URL no entry allows (decided by the URL alone)."""
    return InvalidRequest(
        "image URLs over http(s) are fetched only from the hosts and ports listed in "
        "--allowed-media-domains; send the image as a data: URL (base64)",
        param=param,
        code="invalid_image",
    )


def fetch_failed(param: str) -> InvalidRequest:
    """The one error of a remote image that could not be used, whatever the reason (no
    connection, an error status, a redirect refused, too large, not an image): anything
    more would tell a client what answers where inside the server's network."""
    return InvalidRequest(
        "the image could not be downloaded from its URL (the server's log says why)",
        param=param,
        code="failed_to_download_image",
    )


def shown(url: str) -> str:
    """A URL as the log shows it: scheme, host, port and path (no credentials, no query)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = f":{parts.port}" if parts.port is not None else ""
        return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"
    except ValueError:
        return "(an unreadable URL)"


class AddressRefused(Exception):
    """A name resolved to an address the server may not connect to (logged, not shown)."""


@attrs.frozen
class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's Trio network backend, connecting only to the addresses `hosts` allow: the
    name is resolved here, every address is checked, and the connection goes to a checked
    address (TLS still verifies the name). Cancellation: as Trio's `open_tcp_stream`."""

    hosts: tuple[MediaHost, ...]
    allow_private: bool = False
    inner: httpcore.AsyncNetworkBackend = attrs.field(factory=httpcore.TrioBackend)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        entry = next((e for e in self.hosts if e.host == host.lower()), None)
        if entry is None:  # the URL was checked before; this is a second line
            raise AddressRefused(f"{host} is not an allowed host")
        try:
            with trio.fail_after(float("inf") if timeout is None else timeout):
                infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, trio.TooSlowError) as exc:
            raise httpcore.ConnectError(f"{host} did not resolve: {exc}") from None
        addresses = list(dict.fromkeys(_plain(ipaddress.ip_address(i[4][0])) for i in infos))
        refused = [a for a in addresses if not self._may_connect(a, entry)]
        if refused or not addresses:
            raise AddressRefused(f"{host} resolves to {refused[0] if refused else 'nothing'}")
        failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in addresses:  # in the resolver's order, as Trio's own connect tries them
            try:
                return await self.inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise AddressRefused("media is not fetched over Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)

    def _may_connect(self, address: IPAddress, entry: MediaHost) -> bool:
        if self.allow_private or entry.allows_address(address):
            return True
        return address.is_global and not address.is_multicast


def _plain(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it is (::ffff:127.0.0.1: loopback)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
