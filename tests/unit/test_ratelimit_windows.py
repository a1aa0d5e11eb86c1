"""Parsing rate-limit windows."""

from __future__ import annotations

import pytest

from notifier.settings import Settings
from notifier.specs import parse_limits, parse_window


@pytest.mark.parametrize(
    ("text", "limit", "period", "burst"),
    [
        ("100/s", 100, 1, 10),
        ("500/s", 500, 1, 50),
        ("5/s", 5, 1, 1),
        ("20000/h", 20000, 3600, 20000),
        ("500/10s", 500, 10, 500),
        ("100/s:20", 100, 1, 20),
        (" 3 / m ", 3, 60, 3),
    ],
)
def test_windows(text: str, limit: int, period: float, burst: int) -> None:
    window = parse_window(text)
    assert (window.limit, window.period, window.burst) == (limit, period, burst)


@pytest.mark.parametrize("text", ["", "100", "100/w", "0/s", "-1/s", "1/s:x", "s/100"])
def test_bad_windows_say_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match=r"N/unit|positive"):
        parse_window(text)


def test_limits_by_provider() -> None:
    limits = parse_limits("email=100/s,20000/h; sms = 10/s")
    assert {p: [w.spelling for w in ws] for p, ws in limits.items()} == {
        "email": ["100/s", "20000/h"],
        "sms": ["10/s"],
    }
    assert parse_limits("") == {}


def test_a_malformed_setting_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="provider=windows"):
        Settings(rate_limits="email:100/s")
