"""The small grammars of notifier's settings, each parsed by one function that names what it
expects when it refuses: failover chains, recipient overrides, rate windows, locales,
categories, networks, the status webhook's events, the Redis Sentinels, and the console's users
and host names.

Imports nothing of notifier, so that ``notifier.settings`` can check a value at start-up.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from notifier.specs.console import (
    HOST_SYNTAX,
    HostPattern,
    Role,
    User,
    parse_hash,
    parse_hosts,
    parse_users,
    split_host,
    unb64,
)
from notifier.specs.rates import (
    WARMUP_SYNTAX,
    Cap,
    Warmup,
    Window,
    default_burst,
    parse_caps,
    parse_limits,
    parse_warmup,
    parse_warmups,
    parse_window,
)
from notifier.specs.sentinels import (
    SENTINELS_SYNTAX,
    Address,
    parse_sentinel_master,
    parse_sentinels,
)

__all__ = [
    "CATEGORY_PATTERN",
    "HOST_SYNTAX",
    "PROFILE_PATTERN",
    "SENTINELS_SYNTAX",
    "STATUS_EVENTS",
    "WARMUP_SYNTAX",
    "Address",
    "Cap",
    "HostPattern",
    "QuietWindow",
    "Role",
    "User",
    "Warmup",
    "Window",
    "default_burst",
    "normalize_locale",
    "parse_categories",
    "parse_category",
    "parse_category_defaults",
    "parse_failover",
    "parse_frequency_caps",
    "parse_hash",
    "parse_hosts",
    "parse_limits",
    "parse_networks",
    "parse_overrides",
    "parse_preference_center",
    "parse_profile_id",
    "parse_quiet_hours",
    "parse_quiet_window",
    "parse_sentinel_master",
    "parse_sentinels",
    "parse_status_events",
    "parse_time_zone",
    "parse_users",
    "parse_warmup",
    "parse_warmups",
    "parse_window",
    "split_host",
    "unb64",
]

_LOCALE_PART = re.compile(r"[A-Za-z0-9]{1,8}")
#: A row's or campaign's category, as the ``*_category`` CHECK constraints have it.
CATEGORY_PATTERN = r"[a-z0-9_.-]{1,64}"
#: A producer's id for a person (``profiles.id``, ``notifications.profile``), as the
#: ``profiles_id`` and ``notifications_profile`` CHECK constraints have it: what ids, emails
#: used as ids, URNs and UUIDs are made of, nothing that quotes, spaces or breaks a line.
PROFILE_PATTERN = r"[A-Za-z0-9_.:@+-]{1,200}"


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


def parse_profile_id(text: str) -> str:
    """A producer's id for a person as given, or a ``ValueError`` saying what one looks like."""
    if not re.fullmatch(PROFILE_PATTERN, text):
        raise ValueError(
            f"profile id {text[:80]!r} is not 1 to 200 letters, digits or _ . : @ + -;"
            " use the id your service knows the person by"
        )
    return text


#: A quiet-hours window: wall-clock start and end (``21:00``, ``08:00``); past midnight when
#: the start is later than the end.
QuietWindow = tuple[time, time]
_CLOCK = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


def parse_quiet_window(text: str) -> QuietWindow:
    """``21:00-08:00`` -> (21:00, 08:00)."""
    start, sep, end = text.strip().partition("-")
    clocks = [_CLOCK.fullmatch(part.strip()) for part in (start, end)]
    if not sep or not all(clocks) or start.strip() == end.strip():
        raise ValueError(
            f"quiet hours {text.strip()[:40]!r} are not HH:MM-HH:MM (24 h, start and end"
            " different), e.g. 21:00-08:00"
        )
    first, last = (time(int(m[1]), int(m[2])) for m in clocks if m)
    return first, last


def parse_quiet_hours(text: str) -> dict[str, QuietWindow]:
    """``*=22:00-07:00;marketing/sms=21:00-08:00`` -> window by scope: ``*`` (every category's
    default, which a person's own window replaces), a category, or a category on a channel."""
    windows: dict[str, QuietWindow] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        scope, sep, window = (s.strip() for s in part.partition("="))
        if not sep:
            raise ValueError(f"{part!r} is not SCOPE=HH:MM-HH:MM, e.g. marketing/sms=21:00-08:00")
        category, _, channel = scope.partition("/")
        if scope != "*":
            parse_category(category)
            if "/" in scope and not re.fullmatch(r"[a-z0-9_]{1,64}", channel):
                raise ValueError(f"{scope!r}: the channel after '/' is not a channel name")
        if scope in windows:
            raise ValueError(f"quiet hours for {scope!r} are given twice")
        windows[scope] = parse_quiet_window(window)
    return windows


def parse_time_zone(text: str) -> str:
    """An IANA time zone name this machine's database knows (``Europe/Vienna``, ``UTC``), or a
    ``ValueError`` saying what one looks like."""
    if re.fullmatch(r"[A-Za-z0-9_+-]{1,32}(/[A-Za-z0-9_+-]{1,32}){0,2}", text):
        try:
            ZoneInfo(text)
        except (ZoneInfoNotFoundError, ValueError):
            pass
        else:
            return text
    raise ValueError(f"time zone {text[:80]!r} is not an IANA name like Europe/Vienna or UTC")


def parse_frequency_caps(text: str) -> dict[str, Cap]:
    """``marketing=1/d,3/7d;digest=2/d:wait`` -> each category's cap (``rates.parse_caps``)."""
    caps = parse_caps(text)
    for category in caps:
        parse_category(category)
    return caps


def parse_preference_center(text: str) -> dict[str, list[str]]:
    """``marketing=email,sms;digest=email`` -> the channels of each category, in order, as the
    preference center lists them."""
    center: dict[str, list[str]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        category, sep, channels = (s.strip() for s in part.partition("="))
        names = [c.strip() for c in channels.split(",") if c.strip()]
        if not sep or not names:
            raise ValueError(
                f"{part!r} is not category=channel[,channel], e.g. marketing=email,sms"
            )
        for name in names:
            if not re.fullmatch(r"[a-z0-9_]{1,64}", name):
                raise ValueError(f"{part!r}: {name[:40]!r} is not a channel name")
        if category in center:
            raise ValueError(f"category {category!r} is listed twice")
        center[parse_category(category)] = list(dict.fromkeys(names))
    return center


def parse_categories(text: str) -> frozenset[str]:
    """``security,billing`` -> those categories; empty text: none."""
    return frozenset(parse_category(part.strip()) for part in text.split(",") if part.strip())


def parse_category_defaults(text: str) -> dict[str, bool]:
    """``marketing=off,digest=on`` -> whether each category is on for a person who never
    chose."""
    defaults: dict[str, bool] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        category, sep, value = (s.strip() for s in part.partition("="))
        if not sep or value not in ("on", "off"):
            raise ValueError(f"{part!r} is not category=on or category=off, e.g. marketing=off")
        if category in defaults:
            raise ValueError(f"category {category!r} is given twice")
        defaults[parse_category(category)] = value == "on"
    return defaults


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
