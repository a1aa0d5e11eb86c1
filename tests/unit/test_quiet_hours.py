"""Quiet hours as wall-clock windows in a person's time zone: midnight, DST in both directions,
windows that follow one another, and a property over any moment, zone and windows."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifier.delivery.outcomes import Held
from notifier.delivery.people import quiet_hold
from notifier.delivery.quiet import AlwaysQuiet, held_until, inside, leaves_no_time
from notifier.models import Notification
from notifier.specs import QuietWindow, parse_quiet_hours, parse_quiet_window

VIENNA = ZoneInfo("Europe/Vienna")
NIGHT = (time(21), time(8))


def at(zone: ZoneInfo, *parts: int, fold: int = 0) -> datetime:
    return datetime(*parts, tzinfo=zone, fold=fold)  # type: ignore[misc]


def test_a_window_past_midnight_holds_until_its_end_the_next_morning() -> None:
    until = held_until(at(VIENNA, 2026, 12, 2, 23, 30), VIENNA, [NIGHT])
    assert until == at(VIENNA, 2026, 12, 3, 8, 0)
    assert held_until(at(VIENNA, 2026, 12, 3, 7, 59), VIENNA, [NIGHT]) == at(VIENNA, 2026, 12, 3, 8)
    assert held_until(at(VIENNA, 2026, 12, 3, 8, 0), VIENNA, [NIGHT]) is None
    assert held_until(at(VIENNA, 2026, 12, 3, 20, 59), VIENNA, [NIGHT]) is None


def test_the_end_is_the_persons_wall_clock_in_summer_and_winter() -> None:
    winter = held_until(datetime(2026, 1, 15, 3, tzinfo=UTC), VIENNA, [NIGHT])
    summer = held_until(datetime(2026, 7, 15, 3, tzinfo=UTC), VIENNA, [NIGHT])
    assert winter == datetime(2026, 1, 15, 7, tzinfo=UTC)  # 08:00 CET
    assert summer == datetime(2026, 7, 15, 6, tzinfo=UTC)  # 08:00 CEST


def test_an_end_the_spring_jump_skips_is_the_moment_the_clocks_land() -> None:
    # 29 March 2026, Vienna: 02:00 CET becomes 03:00 CEST. A window ending at 02:30 ends at
    # the jump (01:00 UTC), neither an hour early nor an hour late.
    window = (time(22), time(2, 30))
    until = held_until(at(VIENNA, 2026, 3, 29, 1, 45), VIENNA, [window])
    assert until == datetime(2026, 3, 29, 1, tzinfo=UTC)
    assert until.astimezone(VIENNA).time() == time(3)


def test_an_end_the_autumn_repeats_is_its_first_occurrence_after_now() -> None:
    # 25 October 2026, Vienna: 03:00 CEST becomes 02:00 CET; 02:00-03:00 happens twice.
    window = (time(1), time(2, 30))
    first = held_until(at(VIENNA, 2026, 10, 25, 2, 15, fold=0), VIENNA, [window])
    assert first == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST
    # In the second 02:15 (CET) the first 02:30 is past: the window is over at 02:30 CET.
    second = held_until(at(VIENNA, 2026, 10, 25, 2, 15, fold=1), VIENNA, [window])
    assert second == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)


def test_windows_that_follow_one_another_hold_to_the_end_of_the_last() -> None:
    windows = [(time(21), time(8)), (time(7, 30), time(9)), (time(8, 45), time(9, 15))]
    assert held_until(at(VIENNA, 2026, 12, 2, 23), VIENNA, windows) == at(
        VIENNA, 2026, 12, 3, 9, 15
    )


def test_the_settings_grammar_names_what_is_wrong() -> None:
    assert parse_quiet_hours("*=22:00-07:00; marketing/sms=21:00-08:00") == {
        "*": (time(22), time(7)),
        "marketing/sms": (time(21), time(8)),
    }
    for text, error in [
        ("22:00-07:00", "is not SCOPE=HH:MM-HH:MM"),
        ("*=25:00-07:00", "are not HH:MM-HH:MM"),
        ("*=07:00-07:00", "start and end different"),
        ("Marketing=21:00-08:00", "is not a category"),
        ("marketing/SMS!=21:00-08:00", "is not a channel name"),
        ("*=21:00-08:00;*=22:00-06:00", "given twice"),
    ]:
        with pytest.raises(ValueError, match=error):
            parse_quiet_hours(text)


ZONES = st.sampled_from(
    ["Europe/Vienna", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC",
     "America/Santiago", "Pacific/Chatham"]
)  # fmt: skip
CLOCK = st.builds(time, st.integers(0, 23), st.sampled_from([0, 15, 30, 45]))
WINDOW: st.SearchStrategy[QuietWindow] = st.tuples(CLOCK, CLOCK).filter(lambda w: w[0] != w[1])


@settings(max_examples=300, deadline=None)
@given(
    moment=st.datetimes(
        min_value=datetime(2025, 1, 1), max_value=datetime(2028, 1, 1), timezones=st.just(UTC)
    ),
    zone=ZONES,
    windows=st.lists(WINDOW, min_size=1, max_size=3),
)
def test_a_held_row_waits_exactly_until_no_window_holds_it(
    moment: datetime, zone: str, windows: list[QuietWindow]
) -> None:
    tz = ZoneInfo(zone)
    if leaves_no_time(windows):
        with pytest.raises(AlwaysQuiet, match="leave no time of day"):
            held_until(moment, tz, windows)
        return
    until = held_until(moment, tz, windows)

    def quiet(instant: datetime) -> bool:
        return any(inside(w, instant.astimezone(tz).time().replace(tzinfo=None)) for w in windows)

    if until is None:
        assert not quiet(moment)
        return
    assert quiet(moment)
    assert moment < until <= moment + timedelta(days=2)
    assert not quiet(until)
    # Every quarter hour on the way is quiet: nothing was held longer than it had to be.
    step = moment
    while step + timedelta(minutes=15) < until:
        step += timedelta(minutes=15)
        assert quiet(step) or quiet(step - timedelta(minutes=1)), step


def test_inside_takes_the_start_and_not_the_end() -> None:
    assert inside(NIGHT, time(21))
    assert not inside(NIGHT, time(8))
    assert inside((time(9), time(17)), time(9))
    assert not inside((time(9), time(17)), time(17))
    assert parse_quiet_window("9:00-10:00".rjust(11, "0")) == (time(9), time(10))


def test_a_window_that_begins_before_the_send_could_start_holds_the_row() -> None:
    row = Notification(
        1, "email", "a@example.com", None, "b", {}, 1, 5, uuid4(), datetime.now(UTC),
        category="marketing",
    )  # fmt: skip
    now = datetime(2026, 12, 2, 20, 59, 30, tzinfo=UTC)  # 21:59:30 in Vienna
    quiet = {"marketing": (time(22), time(7))}
    assert quiet_hold(row, now, quiet, set(), "Europe/Vienna") is None
    held = quiet_hold(row, now, quiet, set(), "Europe/Vienna", margin=60)
    assert isinstance(held, Held)
    assert held.until == datetime(2026, 12, 3, 6, tzinfo=UTC)  # 07:00 in Vienna
    assert quiet_hold(row, now, quiet, {"marketing"}, "Europe/Vienna", margin=60) is None
