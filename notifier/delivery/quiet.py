"""Quiet hours: when a row of a category may not reach its person, in the person's time zone.

Windows are wall-clock times in a time zone (``21:00-08:00`` runs past midnight). A row is held
when the person's local time is inside any window that applies to it: the person's own
(``profiles.quiet_start``/``quiet_end``) or else the deployment's default
(``NOTIFIER_QUIET_HOURS`` scope ``*``), and the windows the deployment sets for the row's
category (``marketing``) or category on a channel (``marketing/sms``), which a person cannot
shorten. It is held until the first moment outside all of them, computed in the person's zone,
so a window's end at 08:00 is 08:00 there in winter and in summer, and an end that a DST change
skips (02:30 on the night clocks jump from 02:00 to 03:00) is the first moment after the jump.

Pure: no clock, no database; ``people.py`` decides which rows, ``prepare`` records the hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from notifier.specs import QuietWindow

#: More windows than any deployment chains back to back: past this, the last end found stands.
MAX_CHAINED = 8


def inside(window: QuietWindow, local: time) -> bool:
    """Whether the wall-clock time ``local`` falls inside ``window`` (start included, end not)."""
    start, end = window
    if start == end:
        return False
    if start < end:
        return start <= local < end
    return local >= start or local < end


def _instants(day: date, at: time, zone: ZoneInfo) -> list[datetime]:
    """The UTC instants at which ``zone``'s clocks show ``at`` on ``day``, earliest first: two
    when clocks are set back over it; when they jump over it, the instant they land on."""
    naive = datetime.combine(day, at)
    found = sorted({naive.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)})
    shown = [u for u in found if u.astimezone(zone).replace(tzinfo=None) == naive]
    if shown:
        return shown
    # A gap: the earliest reading shows a time before the jump; step to where the clocks land
    # (transitions fall on whole minutes).
    landing = found[0]
    while landing.astimezone(zone).replace(tzinfo=None) < naive:
        landing += timedelta(minutes=1)
    return [landing]


def _end(window: QuietWindow, now: datetime, zone: ZoneInfo) -> datetime:
    """When ``window``, which holds ``now`` (UTC), next ends: the first instant after ``now``
    at which the clocks in ``zone`` show its end."""
    _, end = window
    day = now.astimezone(zone).date()
    for offset in range(3):
        later = [u for u in _instants(day + timedelta(days=offset), end, zone) if u > now]
        if later:
            return later[0]
    raise AssertionError("a wall-clock time recurs within three days")  # pragma: no cover


class AlwaysQuiet(ValueError):
    """Windows that together cover every minute of the day: nothing may ever be sent."""


def leaves_no_time(windows: Sequence[QuietWindow]) -> bool:
    """Whether ``windows`` together cover the whole day (by the minute, as they are written)."""
    covered: set[int] = set()
    for start, end in windows:
        first, last = start.hour * 60 + start.minute, end.hour * 60 + end.minute
        covered.update(m % 1440 for m in range(first, first + (last - first) % 1440))
    return len(covered) == 1440


def held_until(now: datetime, zone: ZoneInfo, windows: Sequence[QuietWindow]) -> datetime | None:
    """The first instant from ``now`` (aware) outside every window in ``zone``, or ``None`` if
    ``now`` is outside them all. Windows that follow one another are followed to the end of
    the last (at most ``MAX_CHAINED``). ``AlwaysQuiet`` if they leave no time of day."""
    if leaves_no_time(windows):
        raise AlwaysQuiet(f"quiet hours {describe(windows)} leave no time of day to send")
    start = at = now.astimezone(UTC)
    for _ in range(MAX_CHAINED):
        local = at.astimezone(zone).time()
        holding = [w for w in windows if inside(w, local)]
        if not holding:
            break
        at = max(_end(w, at, zone) for w in holding)
    return None if at == start else at


def describe(windows: Iterable[QuietWindow]) -> str:
    """``21:00-08:00, 12:00-13:00``: windows as a reason names them."""
    return ", ".join(f"{start:%H:%M}-{end:%H:%M}" for start, end in windows)
