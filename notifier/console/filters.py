"""The list's filters: what an operator may ask for, and which of it may go into a URL.

Filters that name a person (recipient, dedupe key, error text, which may quote an address)
never travel in a URL, where browser history, proxies and access logs would keep them: the
form POSTs them, the console keeps them in the operator's session under an opaque id, and the
URL carries only that id (``?q=...``). Status, channel, provider, campaign and times may.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime, timedelta

from notifier.console.auth import Session

STATUSES = ("pending", "processing", "sent", "dead", "cancelled")
#: Filters that may appear in a URL.
PUBLIC = ("status", "channel", "provider", "campaign", "since", "until")
#: Filters kept in the session.
PRIVATE = ("recipient", "dedupe_key", "error")
#: Searches an operator's session keeps (the oldest is forgotten first).
KEPT_SEARCHES = 20
#: The longest filter value, in characters.
MAX_LENGTH = 500
#: The times a filter may name: a range that holds every row a producer meant, and whose ends
#: can still be widened by the list's id search without leaving what Python can hold.
EARLIEST, LATEST = datetime(1900, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)
#: The longest duration back from now (``3650d``), as ``notifier requeue --last`` allows.
LONGEST = timedelta(days=3650)


@dataclass(frozen=True, slots=True)
class Filters:
    status: str | None = None
    channel: str | None = None
    provider: str | None = None
    campaign: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    recipient: str | None = None
    dedupe_key: str | None = None
    error: str | None = None

    def public(self) -> dict[str, str]:
        """The filters a URL may carry, as query parameters."""
        return {k: _shown(getattr(self, k)) for k in PUBLIC if getattr(self, k) is not None}

    def private(self) -> dict[str, str]:
        return {k: str(getattr(self, k)) for k in PRIVATE if getattr(self, k) is not None}

    def form(self) -> dict[str, str]:
        """Every filter, as the form's fields show it."""
        return {
            f.name: _shown(getattr(self, f.name))
            for f in fields(self)
            if getattr(self, f.name) is not None
        }

    def params(self) -> dict[str, object]:
        return asdict(self)


def _shown(value: object) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")
    return str(value)


def parse_time(value: str, name: str = "time") -> datetime:
    """``2026-12-01T09:00`` (UTC unless it names a zone), or a duration back from now:
    ``90m``, ``24h``, ``7d``; ``ValueError`` naming ``name`` for anything else, a time outside
    ``EARLIEST``..``LATEST`` or a duration longer than ``LONGEST``."""
    value = value.strip()
    units = {"m": 60, "h": 3600, "d": 86400}
    number = value[:-1]
    if value[-1:] in units and number.isascii() and number.isdigit():
        if len(number) > 12 or int(number) * units[value[-1]] > LONGEST.total_seconds():
            raise ValueError(f"{name}: {value[:20]} is too long ago (at most {LONGEST.days}d)")
        return datetime.now(UTC) - timedelta(seconds=int(number) * units[value[-1]])
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{name}: {value[:40]!r} is not a time (2026-12-01T09:00) or a duration (24h)"
        ) from None
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    if not EARLIEST <= at < LATEST:
        raise ValueError(
            f"{name}: {value[:40]} is out of range (from {EARLIEST.year} to {LATEST.year - 1})"
        )
    return at.astimezone(UTC)


def parse(values: Mapping[str, str], *, private: bool) -> Filters:
    """Filters from a form or a query string; ``ValueError`` for a bad one. Without
    ``private``, the person-naming filters are ignored (a URL must not carry them)."""
    given = {k: v.strip() for k, v in values.items() if isinstance(v, str) and v.strip()}
    allowed = PUBLIC + PRIVATE if private else PUBLIC
    out: dict[str, object] = {}
    for key in allowed:
        if key not in given:
            continue
        value = given[key]
        if "\x00" in value:
            raise ValueError(f"{key} contains a NUL character: remove it")
        if len(value) > MAX_LENGTH:
            raise ValueError(f"{key} is too long (at most {MAX_LENGTH} characters)")
        if key == "status" and value not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}")
        out[key] = parse_time(value, key) if key in ("since", "until") else value
    return Filters(**out)  # type: ignore[arg-type]


def remember(session: Session, filters: Filters) -> str:
    """Keep ``filters``' private part in the session; the id a URL may carry instead."""
    key = secrets.token_urlsafe(9)
    session.searches[key] = filters.private()
    while len(session.searches) > KEPT_SEARCHES:
        del session.searches[next(iter(session.searches))]
    return key


def recall(session: Session, key: str | None) -> dict[str, str]:
    return dict(session.searches.get(key or "", {}))
