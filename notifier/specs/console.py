"""The grammars of the operators' console's settings: its users (``NOTIFIER_CONSOLE_USERS``)
and the host names it answers for (``NOTIFIER_CONSOLE_HOSTS``)."""

from __future__ import annotations

import base64
import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum

# --- the operators' console's users (NOTIFIER_CONSOLE_USERS) ----------------------------------


class Role(StrEnum):
    """What a console user may do."""

    #: everything a viewer may, and every action (requeue, cancel, pause, suppress, ...)
    admin = "admin"
    #: sees every page; every action is refused
    viewer = "viewer"


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password_hash: str
    role: Role


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    parts = encoded.split(".")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("is not a hash made by notifier console hash-password")
    try:
        n, r, p = (int(x) for x in parts[1:4])
        salt, key = unb64(parts[4]), unb64(parts[5])
    except ValueError:
        raise ValueError("is not a hash made by notifier console hash-password") from None
    if n < 2**10 or n & (n - 1) or not 0 < r <= 32 or not 0 < p <= 16 or len(key) < 16:
        raise ValueError("has scrypt parameters too weak or malformed")
    return n, r, p, salt, key


def parse_users(spec: str) -> dict[str, User]:
    """``NOTIFIER_CONSOLE_USERS`` -> users by name; ``ValueError`` naming the bad entry (by its
    position and user name, never its hash)."""
    users: dict[str, User] = {}
    for position, entry in enumerate(filter(None, (e.strip() for e in spec.split(","))), 1):
        parts = entry.split(":")
        if len(parts) != 3:
            raise ValueError(f"entry {position} is not name:hash:role")
        name, encoded, role = (p.strip() for p in parts)
        if not name:
            raise ValueError(f"entry {position} has no user name")
        if role not in Role.__members__:
            raise ValueError(f"user {name!r}: role must be admin or viewer, not {role!r}")
        try:
            parse_hash(encoded)
        except ValueError as exc:
            raise ValueError(f"user {name!r}: the password hash {exc}") from None
        if name in users:
            raise ValueError(f"user {name!r} is listed twice")
        users[name] = User(name, encoded, Role(role))
    return users


# --- the hosts the operators' console answers for (NOTIFIER_CONSOLE_HOSTS) --------------------

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
HOST_SYNTAX = "host[:port], e.g. console.example.com, 127.0.0.1:8090, [::1] or *.example.com"


@dataclass(frozen=True, slots=True)
class HostPattern:
    """A host the console answers for: a name, an IPv4 address or a bracketed IPv6 one, in
    lower case, or ``*.example.com`` for every name under ``example.com``; ``port`` ``None``
    for any port."""

    host: str
    port: int | None = None

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


def split_host(text: str, *, pattern: bool = False) -> tuple[str, int | None]:
    """``host[:port]`` (``[v6][:port]``) -> (host in lower case, port or ``None``); a
    ``ValueError`` saying what is wrong. Only a ``pattern`` may start with ``*.``."""
    text = text.strip().lower()
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket:
            raise ValueError("opens an IPv6 address with [ but does not close it")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise ValueError(f"has [{inside}], which is not an IPv6 address") from None
        host = f"[{inside}]"
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
        name = host[2:] if pattern and host.startswith("*.") else host
        if not _HOST_NAME.match(name):
            raise ValueError("is not a host name or address")
    if not rest:
        return host, None
    port = rest[1:]
    if not rest.startswith(":") or not (port.isascii() and port.isdigit() and len(port) <= 5):
        raise ValueError("has a port that is not a number")
    if not 0 < int(port) < 65536:
        raise ValueError("has a port outside 1 to 65535")
    return host, int(port)


def parse_hosts(spec: str) -> list[HostPattern]:
    """``NOTIFIER_CONSOLE_HOSTS`` -> patterns; ``ValueError`` naming the bad entry."""
    patterns = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        try:
            if "://" in entry:
                raise ValueError("names a scheme (NOTIFIER_CONSOLE_SCHEME says that)")
            patterns.append(HostPattern(*split_host(entry, pattern=True)))
        except ValueError as exc:
            raise ValueError(f"{entry!r} {exc}; write {HOST_SYNTAX}") from None
    return patterns
