"""The command line's value types: durations, times and bounded whole numbers.

Each parser is a plain function that raises ``BadValue`` with a one-line message; ``Parsed``
makes one a click type, so a bad value is a usage error (exit status 2) naming its option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import click

from notifier.cli import terminal

T = TypeVar("T")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: The longest duration any option takes: ten years reaches any row worth naming, and a time
#: that far from now is still a date PostgreSQL and Python can both hold.
MAX_DURATION = timedelta(days=3650)


class BadValue(ValueError):
    """A value a parser refuses; the message, one line, says how to write one."""


def _quoted(value: str) -> str:
    """An argument as an error message shows it: quoted, cut short, control characters spelled."""
    return terminal.shown(repr(value if len(value) <= 40 else value[:40] + "..."))


def parse_duration(value: str) -> timedelta:
    """``90s``, ``15m``, ``24h``, ``7d`` -> a timedelta, at most ``MAX_DURATION``."""
    match = _DURATION.fullmatch(value.strip())
    shown = _quoted(value)
    if not match:
        raise BadValue(f"{shown} is not a duration: use a number and s, m, h or d (e.g. 24h)")
    seconds = float(match[1]) * _UNITS[match[2]]
    if seconds > MAX_DURATION.total_seconds():
        raise BadValue(f"{shown} is too long: at most {MAX_DURATION.days}d")
    return timedelta(seconds=seconds)


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """A parser of whole numbers from ``low`` to ``high``."""

    def parse(value: str) -> int:
        text = value.strip()
        shown = _quoted(text)
        if not re.fullmatch(r"-?\d+", text, re.ASCII):
            raise BadValue(f"{shown} is not a whole number")
        if len(text) > 19 or not low <= int(text) <= high:
            raise BadValue(f"{shown} is out of range: {low} to {high}")
        return int(text)

    return parse


def parse_when(value: str) -> datetime:
    """An ISO 8601 time; without a zone it is taken as UTC."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise BadValue(
            f"{_quoted(value)} is not an ISO 8601 time (e.g. 2026-12-01T09:00:00+00:00)"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def parse_json_object(value: str) -> dict[str, Any]:
    """A JSON object, e.g. ``{"first_name": "Ann"}``."""
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise BadValue(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadValue('must be a JSON object, e.g. \'{"first_name": "Ann"}\'')
    return data


# Subscripted in click's stubs since 8.2, but not at run time before it.
class Parsed(click.ParamType, Generic[T]):  # type: ignore[type-arg]
    """A click type made of one of the parsers above; its ``ValueError`` is a usage error."""

    def __init__(self, name: str, parse: Callable[[str], T]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> T:
        if not isinstance(value, str):
            return value  # type: ignore[no-any-return]  # a default, already parsed
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Parsed("duration", parse_duration)
TIME = Parsed("time", parse_when)
JSON_OBJECT = Parsed("json", parse_json_object)
