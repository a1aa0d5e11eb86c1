"""Warm-ups (``NOTIFIER_RATE_WARMUP``): the grammar, its refusals and the ramp day by day."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from notifier.delivery.ratelimit import rates, windows_on
from notifier.settings import Settings, SettingsError, get_settings
from notifier.settings.loading import _invalid
from notifier.specs import parse_limits, parse_warmup, parse_warmups
from tests.factories import SetEnv

FIRST = date(2026, 12, 1)


def test_a_warmup_doubles_daily_up_to_its_ceiling() -> None:
    w = parse_warmup("50/s x2/d to 2000/s from 2026-12-01")
    days = [FIRST + timedelta(days=n) for n in range(-2, 9)]
    assert [w.limit_on(d) for d in days] == [50, 50, 50, 100, 200, 400, 800, 1600, 2000, 2000, 2000]
    assert [w.day(d) for d in days[:3]] == [-2, -1, 0]
    assert w.limit_on(date(9999, 12, 31)) == 2000  # years of doubling overflow nothing


def test_fractional_factors_and_other_periods() -> None:
    w = parse_warmup(" 5/s  x1.5/d to 100/s   from 2026-12-01 ")
    assert [w.limit_on(FIRST + timedelta(days=n)) for n in range(9)] == [
        5,
        7,
        11,
        16,
        25,
        37,
        56,
        85,
        100,
    ]
    assert w.spelling == "5/s x1.5/d to 100/s from 2026-12-01"
    hourly = parse_warmup("10000/h x3/d to 200000/h from 2026-12-01").window_on(FIRST)
    assert (hourly.limit, hourly.period, hourly.burst) == (10000, 3600, 10000)


def test_the_days_window_keeps_the_warmups_spelling_and_grows_its_burst() -> None:
    w = parse_warmup("100/s x2/d to 1000/s from 2026-12-01")
    first, second = w.window_on(FIRST), w.window_on(FIRST + timedelta(days=1))
    assert first.spelling == second.spelling == w.spelling  # one Redis key for every day
    assert (first.limit, first.burst, second.limit, second.burst) == (100, 10, 200, 20)


def test_a_warmup_applies_beside_the_fixed_windows() -> None:
    limits = parse_limits("email=20000/h;sms=10/s")
    warmups = parse_warmups(
        "email=50/s x2/d to 2000/s from 2026-12-01;push=5/s x2/d to 50/s from 2027-01-01"
    )
    on_day_3 = windows_on(limits, warmups, "email", FIRST + timedelta(days=3))
    assert [(w.spelling, w.limit) for w in on_day_3] == [
        ("20000/h", 20000),
        ("50/s x2/d to 2000/s from 2026-12-01", 400),
    ]
    now = datetime(2026, 12, 4, 23, 59, 59, tzinfo=UTC)
    shown = {
        r.provider: (r.current, r.warmup.describe(r.today) if r.warmup else "")
        for r in rates(limits, warmups, now)
    }
    assert shown == {
        "email": (["20000/h", "400/s"], "day 3 of the warm-up: 400/s today, ceiling 2000/s"),
        "push": (["5/s"], "warm-up starts 2027-01-01: 5/s until then"),
        "sms": (["10/s"], ""),
    }
    later = rates(limits, warmups, datetime(2027, 3, 1, tzinfo=UTC))
    assert later[0].warmup is not None
    assert later[0].warmup.describe(later[0].today) == "warmed up: 2000/s (the ceiling) since day 6"


def test_the_day_is_the_utc_day_whatever_the_clocks_zone() -> None:
    warmups = parse_warmups("email=50/s x2/d to 2000/s from 2026-12-01")
    # 00:30 on the 2nd in Berlin is still the 1st in UTC: day 0.
    berlin = datetime(2026, 12, 2, 0, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    assert rates({}, warmups, berlin)[0].current == ["50/s"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("email=50/s to 2000/s from 2026-12-01", "is not a warm-up: write provider=START"),
        ("email=50/s x2/d to 2000/s", "is not a warm-up"),
        ("email=50/s x2/h to 2000/s from 2026-12-01", "is not a warm-up"),
        ("email=50/w x2/d to 2000/s from 2026-12-01", "is not a rate window"),
        ("email=50/s x2/d to 2000/m from 2026-12-01", "the same period"),
        ("email=50/s:5 x2/d to 2000/s from 2026-12-01", "leave out the :burst"),
        ("email=50/s x1/d to 2000/s from 2026-12-01", "more than 1"),
        ("email=50/s x0.5/d to 2000/s from 2026-12-01", "more than 1"),
        ("email=50/s x2/d to 50/s from 2026-12-01", "ceiling must be above"),
        ("email=50/s x2/d to 2000/s from 2026-13-01", "is not a date: write YYYY-MM-DD"),
        (
            "email=50/s x2/d to 2000/s from 2026-12-01;email=5/s x2/d to 9/s from 2026-12-01",
            "two warm-ups",
        ),
        ("=50/s x2/d to 2000/s from 2026-12-01", "is not a warm-up"),
        ("email 50/s x2/d to 2000/s from 2026-12-01", "is not a warm-up"),
        ("email=9999999999999999999999/s x2/d to 2000/s from 2026-12-01", "is not a rate window"),
    ],
)
def test_bad_warmups_say_how_to_write_one(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\.") as refused:
        parse_warmups(text)
    assert says in str(refused.value)


def test_the_variable_is_named_when_the_environment_gets_it_wrong(set_env: SetEnv) -> None:
    set_env(rate_warmup="email=50/s x2/d to 2000/s from 2026-02-30")
    with pytest.raises(SettingsError) as refused:
        get_settings()
    assert str(refused.value) == (
        "NOTIFIER_RATE_WARMUP: '50/s x2/d to 2000/s from 2026-02-30': 2026-02-30 is not a date:"
        " write YYYY-MM-DD, e.g. 2026-12-01"
    )


# Pieces of the grammar, so that generated text gets past the first check as often as not.
PIECES = st.sampled_from(
    [
        "email",
        "=",
        ";",
        " ",
        "50/s",
        "2000/s",
        "100/m",
        "5/10s",
        "0/s",
        "/s",
        ":5",
        "x",
        "x2/d",
        "x1.5/d",
        "x0/d",
        "/d",
        "to",
        "from",
        "2026-12-01",
        "2026-02-30",
        "9" * 30,
        "\n",
        "\x00",
        "\u2028",
        "é",
    ]
)
WINDOWS = st.one_of(
    st.builds(
        "{}/{}".format,
        st.one_of(st.integers(1, 5000), st.integers(0, 10**13)),
        st.sampled_from(["s", "s", "s", "m", "h", "d", "10s", "w"]),
    ),
    st.sampled_from(["50/s:5", "/s", "s/5"]),
)
FACTORS = st.one_of(
    st.sampled_from(["2", "1.5", "1", "0.5", "1.001", "999.999", "1e3", "nan"]),
    st.integers(0, 2000).map(str),
)
DATES = st.one_of(
    st.dates().map(date.isoformat), st.sampled_from(["2026-02-30", "2026-13-01", "0000-01-01"])
)
WARMUPS = st.builds(
    "{}={} x{}/d to {} from {}".format,
    st.sampled_from(["email", "sms", " ", ""]),
    WINDOWS,
    FACTORS,
    WINDOWS,
    DATES,
)
GOOD = st.builds(
    lambda provider, start, more, factor, unit, day: (
        f"{provider}={start}/{unit} x{factor}/d to {start + more}/{unit} from {day}"
    ),
    st.sampled_from(["email", "sms", "email_backup"]),
    st.integers(1, 10**6),
    st.integers(1, 10**6),
    st.sampled_from(["2", "1.5", "1.001", "999.999", "3"]),
    st.sampled_from(["s", "m", "h", "d", "10s"]),
    st.dates().map(date.isoformat),
)
TEXTS = st.one_of(
    st.lists(st.one_of(GOOD, WARMUPS), min_size=1, max_size=3).map(";".join),
    st.text(max_size=80),
    st.lists(st.one_of(PIECES, st.text(max_size=3)), max_size=16).map("".join),
    st.lists(PIECES, max_size=16).map(" ".join),
)


@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_any_text_is_a_warmup_or_one_line_naming_the_variable_and_the_fix(text: str) -> None:
    try:
        warmups = Settings(rate_warmup=text).rate_warmup
    except ValidationError as exc:
        messages = _invalid(exc)
        assert len(messages) == 1
        (message,) = messages
        assert message.startswith("NOTIFIER_RATE_WARMUP: ")
        assert "e.g." in message
        assert message.splitlines() == [message]
        return
    for provider, warmup in warmups.items():
        assert provider.strip() == provider != ""
        assert 1 <= warmup.start.limit < warmup.ceiling.limit
        assert warmup.start.limit <= warmup.limit_on(FIRST) <= warmup.ceiling.limit
        assert warmup.limit_on(date.max) == warmup.ceiling.limit
