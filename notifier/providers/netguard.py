"""Keep webhooks out of the deployment's own network (server-side request forgery).

A producer chooses the webhook URL, so without this check it could make notifier POST to the
cloud metadata service (169.254.169.254), to Redis or PostgreSQL on localhost, or to any service
on the private network that trusts requests from inside it. The rule:

* every address a webhook host resolves to must be a public one: not loopback, private
  (RFC 1918, fc00::/7), link-local (169.254/16, fe80::/10), unspecified, multicast, reserved or
  shared (100.64/10, carrier-grade NAT), also when written as an IPv4-mapped, NAT64 or 6to4
  IPv6 address; a host with one bad address among good ones is refused as a whole;
* unless the address is in ``NOTIFIER_WEBHOOK_ALLOWED_NETWORKS``, the operator's exceptions.

**Where the check runs.** ``GuardedBackend`` is the httpcore network backend of the webhook
client: it resolves the host itself, checks every address, then connects to one of those very
addresses. What is checked is therefore exactly what is connected to, which closes the DNS
rebinding window (a name that answers a public address to a first lookup and 127.0.0.1 to the
second) and makes URL-parser tricks (``127.1``, ``0x7f.1``, ``2130706433``, userinfo
confusion) pointless: whatever httpcore would connect to goes through the check. TLS still
verifies the certificate against the host name, because httpcore starts TLS on top of the
connected socket with the original host as server name. Pooled keep-alive connections were
checked when they were opened.

**Redirects** are never followed (a 3xx is a ``Permanent`` outcome), so no redirect can lead
to an address that was not checked. **Proxies** from the environment (``HTTPS_PROXY``) are not
used for webhooks: through a proxy the check would vet the proxy, not the target.
"""

from __future__ import annotations

import socket
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

import httpcore
import httpx

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

ALLOW_SETTING = "NOTIFIER_WEBHOOK_ALLOWED_NETWORKS"

# First match wins. Everything not listed is public. IPv4 inside IPv6 is handled before these.
_BLOCKED_V4: tuple[tuple[IPv4Network, str], ...] = tuple(
    (IPv4Network(net), kind)
    for net, kind in (
        ("0.0.0.0/8", "unspecified"),  # "this network"; Linux connects 0.0.0.0 to localhost
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared (carrier-grade NAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),  # cloud metadata services live at 169.254.169.254
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),  # IETF protocol assignments
        ("192.0.2.0/24", "reserved"),  # documentation
        ("192.88.99.0/24", "reserved"),  # former 6to4 relay anycast
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "reserved"),  # benchmarking
        ("198.51.100.0/24", "reserved"),  # documentation
        ("203.0.113.0/24", "reserved"),  # documentation
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # including the broadcast address 255.255.255.255
    )
)
_BLOCKED_V6: tuple[tuple[IPv6Network, str], ...] = tuple(
    (IPv6Network(net), kind)
    for net, kind in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "private"),  # local-use NAT64
        ("100::/64", "reserved"),  # discard-only
        ("2001::/23", "reserved"),  # IETF protocol assignments, Teredo among them
        ("2001:db8::/32", "reserved"),  # documentation
        ("3fff::/20", "reserved"),  # documentation
        ("fc00::/7", "private"),  # unique local addresses
        ("fe80::/10", "link-local"),
        ("fec0::/10", "private"),  # the deprecated site-local addresses
        ("ff00::/8", "multicast"),
    )
)
# Global unicast is all that is allocated in IPv6; anything outside it is reserved.
_GLOBAL_UNICAST = IPv6Network("2000::/3")
_NAT64 = IPv6Network("64:ff9b::/96")


@dataclass(frozen=True, slots=True)
class Forbidden:
    """Why an address is refused: what kind it is and the block that makes it so."""

    kind: str
    block: str
    """The block that makes it so, e.g. ``in 127.0.0.0/8``."""
    via: str | None = None
    """How an IPv4 address was written inside an IPv6 one: ``IPv4-mapped``, ``NAT64``, ..."""

    def describe(self) -> str:
        words = f"{self.via} {self.kind}" if self.via else self.kind
        article = "an" if words[0] in "aeiouAEIOU" else "a"
        return f"{article} {words} address ({self.block})"


def embedded_ipv4(ip: IPAddress) -> tuple[IPv4Address, str] | None:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64, 6to4), with how it does."""
    if isinstance(ip, IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF), "NAT64"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    return None


def forbidden(ip: IPAddress) -> Forbidden | None:
    """Why ``ip`` must not be called, or ``None`` for a public address. Pure.

    Written as explicit tables rather than ``ip.is_global``/``is_private``, whose answers have
    changed between Python patch releases.
    """
    embedded = embedded_ipv4(ip)
    if embedded is not None:
        inner, via = embedded
        found = forbidden(inner)
        return None if found is None else Forbidden(found.kind, found.block, via)
    if isinstance(ip, IPv4Address):
        for net4, kind in _BLOCKED_V4:
            if ip in net4:
                return Forbidden(kind, f"in {net4}")
        return None
    for net6, kind in _BLOCKED_V6:
        if ip in net6:
            return Forbidden(kind, f"in {net6}")
    if ip not in _GLOBAL_UNICAST:
        return Forbidden("reserved", f"outside {_GLOBAL_UNICAST}, the allocated unicast block")
    return None


class BlockedAddress(Exception):
    """A webhook host resolved to an address notifier refuses to call; ``str()`` says why."""


class AddressPolicy:
    """The rule above, with the operator's allowed networks as exceptions."""

    def __init__(self, allowed: Iterable[IPNetwork] = ()) -> None:
        self.allowed: tuple[IPNetwork, ...] = tuple(allowed)

    def refusal(self, host: str, ip: IPAddress) -> str | None:
        """The reason to refuse ``ip`` (an address of ``host``), or ``None`` to allow it."""
        if self._is_allowed(ip):
            return None
        found = forbidden(ip)
        if found is None:
            return None
        what = found.describe()
        where = f"is {what}" if _literal(host) == ip else f"resolves to {ip}, {what}"
        return (
            f"webhook target {host} {where}; notifier does not call internal networks. "
            f"Use a public URL, or have the operator allow that network with {ALLOW_SETTING}"
        )

    def check_literal(self, host: str) -> str | None:
        """The reason to refuse ``host`` if it is an IP address literal; no DNS is involved.

        Hosts that are names, or that only some resolvers read as addresses (``127.1``), are
        left to ``resolve``, which sees what the resolver makes of them.
        """
        ip = _literal(host)
        return None if ip is None else self.refusal(host, ip)

    def resolve(self, host: str, port: int) -> list[str]:
        """Every address ``host`` resolves to, all of them allowed, in the resolver's order.

        Raises ``BlockedAddress`` if any is refused, and ``OSError`` (``socket.gaierror``) or
        ``UnicodeError`` (a label the IDNA codec refuses) if the name cannot be resolved.
        """
        addresses: list[str] = []
        for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            address = str(sockaddr[0])  # an IPv6 one may carry a zone: "fe80::1%eth0"
            reason = self.refusal(host, ip_address(address))
            if reason is not None:
                raise BlockedAddress(reason)
            addresses.append(address)
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"no IPv4 or IPv6 address for {host}")
        return addresses

    def _is_allowed(self, ip: IPAddress) -> bool:
        embedded = embedded_ipv4(ip)
        candidates: list[IPAddress] = [ip] if embedded is None else [ip, embedded[0]]
        return any(c in net for c in candidates for net in self.allowed)


def _literal(host: str) -> IPAddress | None:
    try:
        return ip_address(host)
    except ValueError:
        return None


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's blocking backend, connecting only to addresses the policy allows.

    The host is resolved here, once; the connection goes to the vetted address literally, so
    the stock ``connect_tcp`` below does no lookup of its own.
    """

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = self.policy.resolve(host, port)
        except (OSError, UnicodeError) as exc:  # DNS trouble is transient: the row is retried
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        options = list(socket_options or ())
        last: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in addresses:  # one after the other, as socket.create_connection does
            try:
                return super().connect_tcp(address, port, timeout, local_address, options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None  # resolve() returns at least one address
        raise last


def guarded_transport(policy: AddressPolicy, limits: httpx.Limits) -> httpx.HTTPTransport:
    """An ``httpx.HTTPTransport`` whose connections all go through ``GuardedBackend``.

    httpx has no public way to pass a network backend, so the transport's httpcore pool is
    replaced by one built with it. Should a future httpx keep its pool elsewhere, this raises
    when the client is built (on the first send) rather than letting anything out unchecked.
    """
    transport = httpx.HTTPTransport(limits=limits)
    if not isinstance(getattr(transport, "_pool", None), httpcore.ConnectionPool):
        raise RuntimeError(
            "httpx.HTTPTransport no longer keeps an httpcore.ConnectionPool in _pool; the "
            "webhook address check cannot be installed (pin httpx or update netguard.py)"
        )
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=GuardedBackend(policy),
    )
    return transport
