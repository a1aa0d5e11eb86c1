"""The small grammars of notifier's settings, each parsed by one function that names what it
expects when it refuses: failover chains, recipient overrides, rate windows, locales,
categories, networks, the status webhook's events, and the console's users and host names.

Imports nothing of notifier, so that ``notifier.settings`` can check a value at start-up.
"""

from __future__ import annotations

import base64
import ipaddress
import math
import re
from dataclasses import dataclass
from datetime import date
from enum import StrEnum

_LOCALE_PART = re.compile(r"[A-Za-z0-9]{1,8}")
#: A row's or campaign's category, as the ``*_category`` CHECK constraints have it.
CATEGORY_PATTERN = r"[a-z0-9_.-]{1,64}"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Digits are bounded: Python refuses to read an integer of thousands of digits, and no rate
# needs more than twelve.
_WINDOW = re.compile(r"^\s*(\d{1,12})\s*/\s*(\d{0,12})\s*([smhd])\s*(?::\s*(\d{1,12}))?\s*$")


def parse_failover(text: str) -> dict[str, list[str]]:
    """``email=email,email_backup;sms=sms,sms_backup`` -> provider names by channel, in order."""
    chains: dict[str, list[str]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        channel, sep, names = part.partition("=")
        providers = [n.strip() for n in names.split(",") if n.strip()]
        if not sep or not channel.strip() or not providers:
            raise ValueError(
                f"{part!r} is not channel=provider,provider..., e.g. email=email,email_backup"
            )
        chains[channel.strip()] = providers
    return chains


def parse_overrides(text: str) -> dict[str, str]:
    """``email=qa@example.com;sms=+14155550100`` -> recipient by channel."""
    overrides: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        channel, sep, recipient = (s.strip() for s in part.partition("="))
        if not sep or not channel or not recipient:
            raise ValueError(
                f"{part!r} is not channel=recipient, e.g. email=qa@example.com;sms=+14155550100"
            )
        if channel in overrides:
            raise ValueError(f"channel {channel!r} is overridden twice")
        overrides[channel] = recipient
    return overrides


def parse_category(text: str) -> str:
    """A category as given (``marketing``, ``billing.invoices``), or a ``ValueError`` saying
    what one looks like; ``None`` is for transactional rows and is never parsed."""
    if not re.fullmatch(CATEGORY_PATTERN, text):
        raise ValueError(
            f"category {text[:80]!r} is not a category like marketing or security: use 1 to 64"
            " of a-z, 0-9, '_', '.', '-' (or no category for transactional messages)"
        )
    return text


def normalize_locale(text: str) -> str:
    """``de_at`` -> ``de-AT``, ``zh-hant-tw`` -> ``zh-Hant-TW``: BCP 47's conventional case,
    so that rows and templates written either way find each other."""
    parts = re.split(r"[-_]", text.strip())
    if not all(_LOCALE_PART.fullmatch(p) for p in parts) or not parts[0].isalpha():
        raise ValueError(f"{text!r} is not a locale like en, de or de-AT")
    normalized = [parts[0].lower()]
    for part in parts[1:]:
        if len(part) == 2 and part.isalpha():
            normalized.append(part.upper())
        elif len(part) == 4 and part.isalpha():
            normalized.append(part.title())
        else:
            normalized.append(part.lower())
    return "-".join(normalized)


@dataclass(frozen=True, slots=True)
class Window:
    """At most ``limit`` sends per ``period`` seconds, in bursts of at most ``burst``."""

    limit: int
    period: float
    burst: int
    spelling: str

    @property
    def rate_per_ms(self) -> float:
        return self.limit / (self.period * 1000.0)


def parse_window(text: str) -> Window:
    """``100/s``, ``20000/h``, ``500/10s`` (per ten seconds), ``100/s:20`` (burst of 20).

    The burst defaults to a tenth of a second's worth for windows of a second or less (so a
    per-second limit is never exceeded by more than a tenth) and to the whole limit otherwise.
    """
    match = _WINDOW.match(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a rate window: write N/unit with unit s, m, h or d, e.g. 100/s,"
            " 20000/h, 500/10s, or 100/s:20 for a burst of 20"
        )
    limit, count, unit, burst = match.groups()
    period = (float(count) if count else 1.0) * _UNITS[unit]
    if int(limit) < 1 or period <= 0:
        raise ValueError(f"{text!r}: the limit and the period must be positive, e.g. 100/s")
    given = int(burst) if burst else default_burst(int(limit), period)
    return Window(int(limit), period, given, text.strip())


def default_burst(limit: int, period: float) -> int:
    """A tenth of a second's worth for windows of a second or less, else the whole limit."""
    return max(1, math.ceil(limit / (10 * period))) if period <= 1 else limit


def parse_limits(text: str) -> dict[str, list[Window]]:
    """``email=100/s,20000/h;webhook=500/s`` -> windows by provider."""
    limits: dict[str, list[Window]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        provider, sep, windows = part.partition("=")
        if not sep or not provider.strip() or not windows.strip():
            raise ValueError(f"{part!r} is not provider=windows, e.g. email=100/s,20000/h")
        limits[provider.strip()] = [parse_window(w) for w in windows.split(",")]
    return limits


# --- a provider's limit that ramps up by day (NOTIFIER_RATE_WARMUP) ---------------------------

WARMUP_SYNTAX = (
    "provider=START xFACTOR/d to CEILING from YYYY-MM-DD (UTC),"
    " e.g. email=50/s x2/d to 2000/s from 2026-12-01"
)
_WARMUP = re.compile(
    r"^\s*(?P<start>[^\sx]+)\s+x\s*(?P<factor>\d{1,3}(?:\.\d{1,3})?)\s*/\s*d\s+to\s+"
    r"(?P<ceiling>\S+)\s+from\s+(?P<day>\d{4}-\d{2}-\d{2})\s*$"
)


@dataclass(frozen=True, slots=True)
class Warmup:
    """A limit that starts at ``start`` on ``first_day`` (UTC) and is multiplied by ``factor``
    every day after, up to ``ceiling``: a new sending domain or number earns its reputation
    a day at a time. Before ``first_day`` the start applies.

    The first day is a setting, not when a worker started, so every worker agrees on the day
    and a restart does not begin the ramp again."""

    start: Window
    factor: float
    ceiling: Window
    first_day: date
    spelling: str

    def day(self, today: date) -> int:
        """Days since the first (0 on it, negative before it)."""
        return (today - self.first_day).days

    def limit_on(self, today: date) -> int:
        """The day's limit per period: the start times the factor for each day since the
        first, at most the ceiling."""
        day = max(0, self.day(today))
        # Compared as logarithms: a factor to the power of years of days overflows a float.
        if day * math.log(self.factor) >= math.log(self.ceiling.limit / self.start.limit):
            return self.ceiling.limit
        return min(self.ceiling.limit, math.floor(self.start.limit * self.factor**day + 1e-9))

    def window_on(self, today: date) -> Window:
        """The day's window, spelt as the whole warm-up: its bucket in Redis keeps one key
        from one day to the next, so a new day raises the rate without refilling a burst."""
        limit = self.limit_on(today)
        period = self.start.period
        return Window(limit, period, default_burst(limit, period), self.spelling)

    def rate_on(self, today: date) -> str:
        """The day's limit, spelt like the start: ``400/s``."""
        return f"{self.limit_on(today)}/{self.start.spelling.partition('/')[2]}"

    def describe(self, today: date) -> str:
        """``day 3 of the warm-up: 400/s today, ceiling 2000/s`` (or when it starts)."""
        rate = self.rate_on(today)
        if self.day(today) < 0:
            return f"warm-up starts {self.first_day.isoformat()}: {rate} until then"
        if self.limit_on(today) >= self.ceiling.limit:
            return f"warmed up: {rate} (the ceiling) since day {self._days_to_ceiling()}"
        return (
            f"day {self.day(today)} of the warm-up: {rate} today, ceiling {self.ceiling.spelling}"
        )

    def _days_to_ceiling(self) -> int:
        return math.ceil(
            math.log(self.ceiling.limit / self.start.limit) / math.log(self.factor) - 1e-9
        )


def _shown(text: str) -> str:
    """``text`` quoted for a one-line error, at most 80 characters of it."""
    text = text.strip()
    return repr(text if len(text) <= 80 else text[:77] + "...")


def parse_warmup(text: str) -> Warmup:
    """``50/s x2/d to 2000/s from 2026-12-01`` -> a ``Warmup``."""
    match = _WARMUP.match(text)
    if not match:
        raise ValueError(f"{_shown(text)} is not a warm-up: write {WARMUP_SYNTAX}")
    try:
        start, ceiling = parse_window(match["start"]), parse_window(match["ceiling"])
    except ValueError as exc:
        raise ValueError(f"{_shown(text)}: {exc}") from None
    if ":" in start.spelling or ":" in ceiling.spelling:
        raise ValueError(
            f"{_shown(text)}: a warm-up sets its own bursts; leave out the :burst,"
            " e.g. 50/s to 2000/s"
        )
    if start.period != ceiling.period:
        raise ValueError(
            f"{_shown(text)}: the start and the ceiling must count per the same period,"
            " e.g. 50/s to 2000/s"
        )
    factor = float(match["factor"])
    if factor <= 1:
        raise ValueError(
            f"{_shown(text)}: the factor must be more than 1, e.g. x2/d (a flat limit belongs"
            " in NOTIFIER_RATE_LIMITS)"
        )
    if ceiling.limit <= start.limit:
        raise ValueError(
            f"{_shown(text)}: the ceiling must be above the start, e.g. 50/s x2/d to 2000/s"
        )
    try:
        first_day = date.fromisoformat(match["day"])
    except ValueError:
        raise ValueError(
            f"{_shown(text)}: {match['day']} is not a date: write YYYY-MM-DD, e.g. 2026-12-01"
        ) from None
    spelling = " ".join(text.split())
    return Warmup(start, factor, ceiling, first_day, spelling)


def parse_warmups(text: str) -> dict[str, Warmup]:
    """``email=50/s x2/d to 2000/s from 2026-12-01;sms=...`` -> warm-ups by provider."""
    warmups: dict[str, Warmup] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        provider, sep, spec = (s.strip() for s in part.partition("="))
        if not sep or not provider or not spec:
            raise ValueError(f"{_shown(part)} is not a warm-up: write {WARMUP_SYNTAX}")
        if provider in warmups:
            raise ValueError(
                f"provider {_shown(provider)} has two warm-ups; give it one, e.g."
                f" {provider}=50/s x2/d to 2000/s from 2026-12-01"
            )
        warmups[provider] = parse_warmup(spec)
    return warmups


def parse_networks(text: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``10.0.0.0/8,fd00::/8`` (comma-separated CIDRs; a plain address is one host) -> networks."""
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            networks.append(ipaddress.ip_network(item))
        except ValueError as exc:
            raise ValueError(
                f"{item!r} is not a network in CIDR notation like 10.0.0.0/8 or fd00::/8 ({exc})"
            ) from None
    return networks


#: What the status webhook may report: the final statuses and the delivery states.
STATUS_EVENTS = ("sent", "dead", "cancelled", "delivered", "undelivered", "bounced", "complained")


def parse_status_events(text: str) -> list[str]:
    """``dead,bounced`` -> those names; a ``ValueError`` naming any that is no event."""
    events = [part.strip() for part in text.split(",") if part.strip()]
    unknown = set(events) - set(STATUS_EVENTS)
    if unknown:
        known = ", ".join(sorted(STATUS_EVENTS))
        raise ValueError(f"unknown {', '.join(sorted(unknown))}; known: {known}")
    return events


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
