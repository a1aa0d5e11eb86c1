"""The command line's argument types: durations, times and bounded whole numbers."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from notifier.cli import terminal

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: The longest duration any option takes: ten years reaches any row worth naming, and a time
#: that far from now is still a date PostgreSQL and Python can both hold.
MAX_DURATION = timedelta(days=3650)


def _quoted(value: str) -> str:
    """An argument as an error message shows it: quoted, cut short, control characters spelled."""
    return terminal.shown(repr(value if len(value) <= 40 else value[:40] + "..."))


def parse_duration(value: str) -> timedelta:
    """``90s``, ``15m``, ``24h``, ``7d`` -> a timedelta, at most ``MAX_DURATION``."""
    match = _DURATION.fullmatch(value.strip())
    shown = _quoted(value)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{shown} is not a duration: use a number and s, m, h or d (e.g. 24h)"
        )
    seconds = float(match[1]) * _UNITS[match[2]]
    if seconds > MAX_DURATION.total_seconds():
        raise argparse.ArgumentTypeError(f"{shown} is too long: at most {MAX_DURATION.days}d")
    return timedelta(seconds=seconds)


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(value: str) -> int:
        text = value.strip()
        shown = _quoted(text)
        if not re.fullmatch(r"-?\d+", text, re.ASCII):
            raise argparse.ArgumentTypeError(f"{shown} is not a whole number")
        if len(text) > 19 or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"{shown} is out of range: {low} to {high}")
        return int(text)

    return parse


def parse_when(value: str) -> datetime:
    """An ISO 8601 time; without a zone it is taken as UTC."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 time (e.g. 2026-12-01T09:00:00+00:00)"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)
