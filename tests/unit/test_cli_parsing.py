"""The command line's parsing of times and durations."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from notifier.cli import parse_duration, parse_when


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("24h", timedelta(hours=24)),
        ("1.5d", timedelta(hours=36)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "24", "h", "-1h", "1w", "1 h x"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="use a number and s, m, h or d"):
        parse_duration(text)


def test_times_without_a_zone_are_utc() -> None:
    assert parse_when("2026-12-01T09:00:00") == datetime(2026, 12, 1, 9, tzinfo=UTC)
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        parse_when("tomorrow")
