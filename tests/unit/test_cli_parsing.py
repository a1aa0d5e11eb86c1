"""The command line's parsing of times and durations."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from importlib import metadata
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifier.cli.main import main
from notifier.cli.parsing import (
    MAX_DURATION,
    BadValue,
    parse_duration,
    parse_when,
    whole_number,
)

T = TypeVar("T")


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
    with pytest.raises(BadValue, match="use a number and s, m, h or d"):
        parse_duration(text)


def test_times_without_a_zone_are_utc() -> None:
    assert parse_when("2026-12-01T09:00:00") == datetime(2026, 12, 1, 9, tzinfo=UTC)
    with pytest.raises(BadValue, match="ISO 8601"):
        parse_when("tomorrow")


@pytest.mark.parametrize("text", ["99999999d", "3651d", "9" * 5000 + "s", "87600.1h"])
def test_durations_past_the_maximum_are_refused_by_name(text: str) -> None:
    with pytest.raises(BadValue, match=r"is too long: at most 3650d$"):
        parse_duration(text)


def test_the_maximum_duration_itself_is_taken() -> None:
    assert parse_duration("3650d") == MAX_DURATION


@given(st.one_of(st.text(), st.from_regex(r"\A\s*[0-9]{0,30}(\.[0-9]{0,30})?[smhdw]?\s*\Z")))
def test_any_text_is_a_bounded_duration_or_the_parsers_own_error(text: str) -> None:
    parsed = _parsed(parse_duration, text)
    if isinstance(parsed, BadValue):
        assert "\n" not in str(parsed)
    else:
        assert timedelta(0) <= parsed <= MAX_DURATION
        assert datetime.now(UTC) - parsed <= datetime.now(UTC) + parsed  # usable as an offset


@given(st.one_of(st.text(), st.from_regex(r"\A\s*-?[0-9]{0,30}\s*\Z")))
def test_any_text_is_a_whole_number_in_range_or_the_parsers_own_error(text: str) -> None:
    parsed = _parsed(whole_number(1, 1440), text)
    if isinstance(parsed, BadValue):
        assert "\n" not in str(parsed)
    else:
        assert 1 <= parsed <= 1440


def _parsed(parse: Callable[[str], T], text: str) -> T | BadValue:
    """What ``parse`` makes of ``text``: its value or its own error; anything else propagates."""
    try:
        return parse(text)
    except BadValue as exc:
        return exc


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["requeue", "--last", "99999999d"], "--last"),
        (["cancel", "--last", "99999999d", "--dry-run"], "--last"),
        (["send", "--channel", "null", "--to", "x", "--in", "99999999d"], "--in"),
        (["send", "--channel", "null", "--to", "x", "--expires-in", "99999999d"], "--expires-in"),
        (["stats", "--minutes", "99999999999999"], "--minutes"),
    ],
)
def test_an_overflowing_option_is_one_usage_error_naming_it(argv: list[str], option: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "notifier.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"Error: Invalid value for '{option}': ")
    assert "Traceback" not in done.stderr


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"notifier {metadata.version('notifier')}\n"
