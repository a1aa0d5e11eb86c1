"""Keep webhooks out of the deployment's own network (server-side request forgery).

A producer chooses the webhook URL, so without this check it could make notifier POST to the
cloud metadata service (169.254.169.254), to Redis or PostgreSQL on localhost, or to any service
on the private network that trusts requests from inside it. The rule:

* every address a webhook host resolves to must be a public one: not loopback, private
  (RFC 1918, fc00::/7), link-local (169.254/16, fe80::/10), unspecified, multicast, reserved or
  shared (100.64/10, carrier-grade NAT), also when written as an IPv4-mapped, NAT64 or 6to4
  IPv6 address; a host with one bad address among good ones is refused as a whole;
* unless the address is in ``NOTIFIER_WEBHOOK_ALLOWED_NETWORKS``, the operator's exceptions.

**Where the check runs.** The webhook client (aiohttp) connects only through two checks:
``GuardedResolver`` resolves a host name itself and refuses it if any of its addresses is
refused, and the client then connects to those very addresses; ``guarded_socket``, the client's
socket factory, checks again the address each socket is about to connect to, the one place every
connection passes whatever its host was (an IP literal never reaches a resolver). What is
checked is therefore exactly what is connected to, which closes the DNS rebinding window (a name
that answers a public address to a first lookup and 127.0.0.1 to the second) and makes URL-parser
tricks (``0x7f.1``, userinfo confusion) pointless; the legacy numeric forms (``127.1``,
``2130706433``) are refused outright (``legacy_ipv4``). TLS still verifies the certificate against
the host name, which the client keeps as the server name. Pooled keep-alive connections were
checked when they were opened.

**Redirects** are never followed (a 3xx is a ``Permanent`` outcome), so no redirect can lead
to an address that was not checked. **Proxies** from the environment (``HTTPS_PROXY``) are not
used for webhooks: through a proxy the check would vet the proxy, not the target.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult

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

        Hosts that are names, or that only some resolvers read as addresses (``0x7f.1``), are
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


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a URL's host, brackets or not) is this machine by name or by address:
    where a provider's API may be plain ``http://`` (tests, a local fake)."""
    if host == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def legacy_ipv4(host: str) -> bool:
    """Digits and dots, yet not a dotted quad (``127.1``, ``2130706433``): the C library reads
    such a host as an IPv4 address; the webhook client refuses to guess, and so does
    ``WebhookProvider.validate``."""
    return host.replace(".", "").isdigit() and _literal(host) is None


def _literal(host: str) -> IPAddress | None:
    try:
        return ip_address(host)
    except ValueError:
        return None


class GuardedResolver(AbstractResolver):
    """The webhook client's resolver: every address of the host, all of them allowed.

    The lookup is the blocking ``AddressPolicy.resolve``, run in the loop's default executor so
    the loop never waits on DNS. DNS trouble is an ``OSError``, which the client reports as a
    connection error (the row is retried); a refused address raises ``BlockedAddress``.
    """

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        try:
            addresses = await loop.run_in_executor(None, self.policy.resolve, host, port)
        except UnicodeError as exc:  # a label the IDNA codec refuses
            raise OSError(socket.EAI_NONAME, f"cannot resolve {host}: {exc}") from exc
        except socket.gaierror as exc:
            raise OSError(exc.errno, f"cannot resolve {host}: {exc.strerror}") from exc
        return [_resolved(host, address, port) for address in addresses]

    async def close(self) -> None:
        return None


def _resolved(host: str, address: str, port: int) -> ResolveResult:
    ipv6 = ":" in address
    return {
        "hostname": host,
        "host": address,
        "port": port,
        "family": socket.AF_INET6 if ipv6 else socket.AF_INET,
        "proto": 0,
        "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
    }


#: (family, type, proto, canonical name, socket address), as ``socket.getaddrinfo`` gives them
AddrInfo = tuple[int, int, int, str, tuple[Any, ...]]


def guarded_socket(policy: AddressPolicy) -> Callable[[AddrInfo], socket.socket]:
    """The webhook client's socket factory: a socket only for an address the policy allows.

    Called with the very address about to be connected to, whether it came from
    ``GuardedResolver`` or was an IP literal in the URL; raises ``BlockedAddress`` otherwise.
    """

    def make(addr_info: AddrInfo) -> socket.socket:
        family, kind, proto, _, sockaddr = addr_info
        address = str(sockaddr[0])
        try:
            ip = ip_address(address)
        except ValueError:  # a name: not resolved by the resolver above, so never checked
            raise BlockedAddress(
                f"webhook target {address} was not resolved through the address check; "
                "notifier does not connect to it"
            ) from None
        reason = policy.refusal(address, ip)
        if reason is not None:
            raise BlockedAddress(reason)
        return socket.socket(family=family, type=kind, proto=proto)

    return make
