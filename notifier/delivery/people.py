"""What the person a row addresses asked for, applied before it is sent: their preference for
the row's category on its channel, and their quiet hours.

A row that names a ``profile`` and a ``category`` is sent only if the person turned that
category on for its channel, or never chose and the deployment's default for the category
(``NOTIFIER_PREFERENCE_DEFAULTS``) is on. Rows of a critical category
(``NOTIFIER_CRITICAL_CATEGORIES``) and transactional rows (no category) are never held back by
a preference; the suppression list applies to every row alike (``prepare``).

Quiet hours (``quiet.py``, ``NOTIFIER_QUIET_HOURS``) hold back rows of a category that is not
critical while it is night where their person is: in the profile's time zone, or
``NOTIFIER_DEFAULT_TIME_ZONE`` for rows that name no person, or whose zone this machine does not
know (the reason says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from notifier.delivery.outcomes import Cancelled, Held
from notifier.delivery.quiet import AlwaysQuiet, describe, held_until
from notifier.models import Notification
from notifier.settings import Settings
from notifier.specs import QuietWindow, parse_time_zone


def refusal(n: Notification, defaults: Mapping[str, bool], critical: Set[str]) -> str | None:
    """Why the person ``n`` addresses does not want it, or ``None`` if they do (or it names
    no person, no category, or a critical one)."""
    person, category = n.profile, n.category
    if person is None or category is None or category in critical:
        return None
    if person.enabled is not None:
        return (
            None
            if person.enabled
            else (f"preference: profile {person.id!r} turned {category} off on {n.channel}")
        )
    if defaults.get(category, True):
        return None
    return (
        f"preference: {category} is off on every channel for a person who has not turned it on"
        f" (NOTIFIER_PREFERENCE_DEFAULTS), and profile {person.id!r} has not"
    )


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(parse_time_zone(name))
    except (ValueError, ZoneInfoNotFoundError):
        return None


def windows_for(n: Notification, quiet_hours: Mapping[str, QuietWindow]) -> list[QuietWindow]:
    """The quiet hours that apply to ``n`` (a row with a category): its person's own window or
    the deployment's default, and the windows of its category and of its category on its
    channel."""
    own = n.profile.quiet if n.profile is not None else None
    scopes = [f"{n.category}", f"{n.category}/{n.channel}"]
    found = [own or quiet_hours.get("*")] + [quiet_hours.get(scope) for scope in scopes]
    return [window for window in found if window is not None]


def quiet_hold(
    n: Notification,
    now: datetime,
    quiet_hours: Mapping[str, QuietWindow],
    critical: Set[str],
    default_zone: str,
    margin: float = 0.0,
) -> Held | Cancelled | None:
    """``Held`` until the quiet hours that hold ``n`` at ``now`` end, or ``None`` if none does
    (or it is transactional or critical); ``Cancelled`` if they leave no time of day.

    A row is sent some time after this look (its batch sends until its deadline): a window
    that begins within ``margin`` seconds holds it too, so that no send starts inside one."""
    if n.category is None or n.category in critical:
        return None
    windows = windows_for(n, quiet_hours)
    if not windows:
        return None
    named = n.profile.time_zone if n.profile is not None else None
    zone = _zone(named) if named else None
    unknown = f" (its time zone {named[:64]!r} is unknown)" if named and zone is None else ""
    zone = zone or _zone(default_zone) or ZoneInfo("UTC")
    try:
        until = held_until(now, zone, windows)
        if until is None and margin > 0:
            until = held_until(now + timedelta(seconds=margin), zone, windows)
    except AlwaysQuiet as exc:
        return Cancelled(str(exc))
    if until is None:
        return None
    local = until.astimezone(zone)
    return Held(
        until,
        f"quiet hours {describe(windows)} in {zone.key}{unknown}:"
        f" held until {local:%Y-%m-%d %H:%M} there",
    )


class Wishes:
    """What the people of a batch asked for, from one deployment's settings: ``refusal`` and
    ``quiet_hold`` for each row, with the margin of a batch's sending time."""

    def __init__(self, settings: Settings) -> None:
        self.defaults = settings.preference_defaults
        self.critical = settings.critical_categories
        self.quiet_hours = settings.quiet_hours
        self.default_zone = settings.default_time_zone
        # A batch sends until its dispatch budget ends, each send at most this long after.
        self.margin = settings.dispatch_budget_seconds + settings.longest_send_seconds

    def apply_to(self, rows: Sequence[Notification]) -> bool:
        """Whether any of ``rows`` may be held back by a person's wish (else skip them all)."""
        return bool(self.quiet_hours) or any(n.profile is not None for n in rows)

    def __call__(self, n: Notification, now: datetime) -> Held | Cancelled | None:
        """Why ``n`` is not sent now by its person's wish: cancelled by their preference, held
        by quiet hours; ``None`` if it may go."""
        refused = refusal(n, self.defaults, self.critical)
        if refused is not None:
            return Cancelled(refused)
        return quiet_hold(n, now, self.quiet_hours, self.critical, self.default_zone, self.margin)
