"""The grammars of ``NOTIFIER_REDIS_SENTINELS`` and ``NOTIFIER_REDIS_SENTINEL_MASTER``: the
Redis Sentinels that name the current primary, and the name they know it by."""

from __future__ import annotations

import re
from dataclasses import dataclass

from notifier.specs.console import split_host

#: Sentinel's own port, for an entry that names none.
SENTINEL_PORT = 26379
SENTINELS_SYNTAX = (
    "host:port separated by commas, e.g. sentinel-1:26379,sentinel-2:26379,sentinel-3:26379"
)


@dataclass(frozen=True, slots=True)
class Address:
    """One Sentinel: a host name or address (an IPv6 one without brackets) and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        """``host:port``, an IPv6 address in brackets: how a URL spells it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_sentinels(text: str) -> list[Address]:
    """``sentinel-1:26379,10.0.0.7:26379,[fd00::7]:26379`` -> addresses, in order; a port left
    out is Sentinel's 26379. Empty text: no Sentinels (``NOTIFIER_REDIS_URL`` names Redis)."""
    addresses: list[Address] = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        try:
            if "://" in entry:
                raise ValueError("names a scheme")
            host, port = split_host(entry)
        except ValueError as exc:
            raise ValueError(f"{entry[:80]!r} {exc}; write {SENTINELS_SYNTAX}") from None
        address = Address(host.strip("[]"), port or SENTINEL_PORT)
        if address in addresses:
            raise ValueError(f"{entry[:80]!r} is listed twice; write {SENTINELS_SYNTAX}")
        addresses.append(address)
    return addresses


def parse_sentinel_master(text: str) -> str:
    """The name the Sentinels monitor the primary under, as given (Sentinel accepts letters,
    digits and ``. - _``), or a ``ValueError`` saying what one looks like."""
    name = text.strip()
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        raise ValueError(
            f"{name[:80]!r} is not a master name: use the name of the Sentinels'"
            " 'sentinel monitor NAME ...' line (letters, digits, '.', '-', '_'), e.g. mymaster"
        )
    return name
