"""The grammar of rates: the windows of ``NOTIFIER_RATE_LIMITS`` and the day-by-day ramps of
``NOTIFIER_RATE_WARMUP``, each parsed by one function that names what it expects."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Digits are bounded: Python refuses to read an integer of thousands of digits, and no rate
# needs more than twelve.
_WINDOW = re.compile(r"^\s*(\d{1,12})\s*/\s*(\d{0,12})\s*([smhd])\s*(?::\s*(\d{1,12}))?\s*$")


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


@dataclass(frozen=True, slots=True)
class Cap:
    """A category's frequency cap: its windows (``limit`` per ``period``), and whether a row
    over it waits (``wait``) or is cancelled."""

    windows: tuple[Window, ...]
    wait: bool
    spelling: str

    def args(self) -> list[int]:
        """Each window's limit and period in ms, as the cap's Lua script takes them."""
        return [value for w in self.windows for value in (w.limit, round(w.period * 1000))]


def parse_caps(text: str) -> dict[str, Cap]:
    """``marketing=1/d,3/7d;digest=2/d:wait`` -> each category's cap (``:wait``: a row over it
    waits for the window, else it is cancelled)."""
    caps: dict[str, Cap] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        category, sep, spec = (s.strip() for s in part.partition("="))
        if not sep or not category or not spec:
            raise ValueError(
                f"{part!r} is not category=N/period[,N/period][:wait], e.g. marketing=1/d,3/7d"
            )
        spec, colon, action = spec.partition(":")
        if colon and action.strip() not in ("wait", "cancel"):
            raise ValueError(f"{part!r}: after ':' say wait or cancel")
        windows = tuple(parse_window(w) for w in spec.split(","))
        if any(":" in w.spelling for w in windows):
            raise ValueError(f"{part!r}: a cap has no burst")
        if category in caps:
            raise ValueError(f"category {category!r} is capped twice")
        caps[category] = Cap(
            windows, action.strip() == "wait", ",".join(w.spelling for w in windows)
        )
    return caps
