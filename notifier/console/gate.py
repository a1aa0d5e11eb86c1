"""The console's front door: the hosts it answers for, the origin its forms must come from,
who the client is, and the path as the routes see it.

A page of ``evil.example`` whose name an attacker makes resolve to 127.0.0.1 (DNS rebinding)
is, to the browser, the same origin as the console: its requests carry ``Host:
evil.example`` and ``Origin: http://evil.example``, which agree with each other. So the
``Host`` is checked against the console's own names before anything else, and a form's
``Origin`` against the console's own origin: its scheme, an allowed host and that host's port.

``X-Forwarded-For`` and ``X-Forwarded-Proto`` are anyone's to send; they are read only from a
peer in ``NOTIFIER_CONSOLE_TRUSTED_PROXIES``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from urllib.parse import quote, unquote_to_bytes, urlsplit

from notifier.specs import HostPattern, split_host

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
DEFAULT_PORTS = {"http": 80, "https": 443}
#: The one line a request for another host gets.
WRONG_HOST = (
    "400 Bad Request: this console does not answer for this host; list it in"
    " NOTIFIER_CONSOLE_HOSTS\n"
)

Network = IPv4Network | IPv6Network


@dataclass(frozen=True)
class Gate:
    hosts: tuple[HostPattern, ...]
    #: how browsers reach the console, unless a trusted proxy says otherwise
    scheme: str = "http"
    proxies: tuple[Network, ...] = ()

    @classmethod
    def loopback(cls, port: int, scheme: str = "http", proxies: Iterable[Network] = ()) -> Gate:
        """The default: 127.0.0.1, localhost and [::1] on ``port``."""
        return cls(tuple(HostPattern(h, port) for h in LOOPBACK), scheme, tuple(proxies))

    def _trusted(self, address: str) -> bool:
        try:
            ip = ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.proxies)

    def front(self, client: str, headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, str]:
        """The client's address and the scheme, for a request from peer ``client``.

        From a trusted proxy: the nearest address of ``X-Forwarded-For`` that is not a trusted
        proxy (the ones further left are whatever the client wrote), and the scheme of
        ``X-Forwarded-Proto``. IPv6 clients are counted by their /64, which one host holds.
        """
        scheme = self.scheme
        if self._trusted(client):
            forwarded: list[str] = []
            for key, value in headers:
                if key == b"x-forwarded-for":
                    forwarded += value.decode("latin-1").split(",")
                elif key == b"x-forwarded-proto" and value.strip() in (b"http", b"https"):
                    scheme = value.strip().decode()
            for hop in reversed([h.strip() for h in forwarded]):
                if not self._trusted(hop):
                    # garbage: the last trusted proxy stands for the client
                    with contextlib.suppress(ValueError):
                        client = str(ip_address(hop))
                    break
                client = hop
        try:
            ip = ip_address(client)
        except ValueError:
            return client[:64], scheme
        if isinstance(ip, IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped), scheme
            return str(ip_network(f"{ip}/64", strict=False)), scheme
        return str(ip), scheme

    def allows(self, authority: str, scheme: str) -> bool:
        """Whether ``host[:port]`` names this console, served on ``scheme``."""
        try:
            host, port = split_host(authority)
        except ValueError:
            return False
        port = port if port is not None else DEFAULT_PORTS.get(scheme, 0)
        return any(p.matches(host, port) for p in self.hosts)

    def host_ok(self, headers: Iterable[tuple[bytes, bytes]], scheme: str) -> bool:
        """Exactly one ``Host`` header, naming this console."""
        hosts = [value for key, value in headers if key == b"host"]
        return len(hosts) == 1 and hosts[0].isascii() and self.allows(hosts[0].decode(), scheme)

    def origin_ok(self, origin: str | None, scheme: str) -> bool:
        """A form's ``Origin`` is the console's own: ``scheme``, an allowed host, its port.

        None (an older browser, or a script) leaves it to the CSRF token; ``null`` (a
        sandboxed frame, a ``data:`` page, a redirect from elsewhere) is refused.
        """
        if origin is None:
            return True
        try:
            parts = urlsplit(origin.strip())
        except ValueError:
            return False
        if parts.scheme != scheme or parts.path or parts.query or parts.fragment:
            return False
        return "@" not in parts.netloc and self.allows(parts.netloc, scheme)


def route_path(raw_path: bytes) -> str:
    """The path the routes match: every segment percent-encoded again, the same way.

    The server's decoded path has lost the difference between ``/`` and ``%2F``, so a name
    holding a ``/`` could not be one segment. Segments of letters, digits and ``-._~`` (every
    fixed part of a route) read as they are; routes decode the rest (``segment`` convertor).
    """
    return "/".join(quote(unquote_to_bytes(part), safe="") for part in raw_path.split(b"/"))
