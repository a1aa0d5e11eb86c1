"""Warm-ups in the shared limiter against a real Redis: the day's rate, across midnight (the
limiter's clock is injected: no test waits for a day), shared by two limiters as two workers."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import Engine

from notifier.delivery.ratelimit import RateLimiter
from notifier.specs import parse_limits, parse_warmups
from tests.commands import run
from tests.factories import SetEnv

# Per hour, so that a bucket's burst is the day's whole limit and its refill is slow enough to
# read the day's rate from the wait the limiter answers: 3,600/h refills one a second.
HOURLY = "email=3600/h x2/d to 36000/h from 2026-12-01"


class Clock:
    """The limiter's clock, set by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _limiter(url: str, clock: Clock, warmups: str = HOURLY, limits: str = "") -> RateLimiter:
    return RateLimiter(
        redis.Redis.from_url(url), parse_limits(limits), parse_warmups(warmups), clock=clock
    )


def test_the_days_rate_holds_until_midnight_utc_and_the_next_days_from_then(
    redis_url: str,
) -> None:
    clock = Clock(datetime(2026, 12, 2, 23, 59, 59, 999_000, tzinfo=UTC))  # day 1: 7,200/h
    limiter = _limiter(redis_url, clock)

    granted, _ = limiter.acquire("email", 100_000)
    assert granted == 7200  # day 1's whole limit: a per-hour burst
    granted, wait = limiter.acquire("email", 1)
    assert granted == 0
    assert 0 < wait <= 0.5  # one token at 2 a second (time passing only shortens the wait)

    clock.now += timedelta(milliseconds=1)  # 00:00:00.000 on the 3rd: day 2, 14,400/h
    granted, wait = limiter.acquire("email", 100_000)
    # The bucket is the same across midnight: no second burst of the new day's limit, only
    # the faster refill (a day's rise at midnight would otherwise be a flood).
    assert granted < 100
    assert 0 < wait <= 0.25  # the next token at 4 a second

    redis.Redis.from_url(redis_url).flushdb()  # an empty bucket holds the whole day's limit
    assert limiter.acquire("email", 100_000)[0] == 14400


def test_before_the_first_day_the_start_applies_and_at_the_ceiling_it_stays(
    redis_url: str,
) -> None:
    early = _limiter(redis_url, Clock(datetime(2026, 11, 1, tzinfo=UTC)))
    assert early.acquire("email", 100_000)[0] == 3600
    redis.Redis.from_url(redis_url).flushdb()
    years_on = _limiter(redis_url, Clock(datetime(2031, 6, 1, tzinfo=UTC)))
    assert years_on.acquire("email", 100_000)[0] == 36000


def test_the_fixed_windows_still_bind_beside_a_warmup(redis_url: str) -> None:
    limiter = _limiter(
        redis_url, Clock(datetime(2026, 12, 5, tzinfo=UTC)), limits="email=1000/h"
    )  # day 4 would allow 57,600/h
    assert limiter.acquire("email", 100_000)[0] == 1000
    assert limiter.acquire("sms", 100_000) == (100_000, 0.0)  # no limit, no warm-up


def test_two_workers_share_the_days_rate(redis_url: str) -> None:
    """Two limiters on their own connections, as two worker processes have, take turns asking
    as fast as they can: together they get the day's rate (200/s on day 1), not each."""
    day_1 = datetime(2026, 12, 2, 12, tzinfo=UTC)
    warmup = "email=100/s x2/d to 1000/s from 2026-12-01"
    workers = [_limiter(redis_url, Clock(day_1), warmup) for _ in range(2)]
    granted = [0, 0]
    started = time.monotonic()
    while time.monotonic() < started + 2.0:
        for i, limiter in enumerate(workers):
            got, wait = limiter.acquire("email", 10)
            granted[i] += got
            if got < 10:
                time.sleep(min(wait, 0.005))
    span = time.monotonic() - started
    assert min(granted) > 0  # both sent
    # 200/s over the time they spanned and one burst of 20; day 0's 100/s could not give this.
    assert 200 * 2.0 * 0.9 <= sum(granted) <= 200 * span + 20 + 1


def test_a_429_holds_the_warmup_back_for_every_worker(redis_url: str) -> None:
    clock = Clock(datetime(2026, 12, 2, 12, tzinfo=UTC))
    warmup = "email=100/s x2/d to 1000/s from 2026-12-01"
    one, other = _limiter(redis_url, clock, warmup), _limiter(redis_url, clock, warmup)
    one.block("email", 2.0)
    granted, wait = other.acquire("email", 5)
    assert granted == 0
    assert 1.5 <= wait <= 2.1


@pytest.mark.usefixtures("restore_logging")  # the command sets up the process's logging
def test_stats_shows_each_limited_providers_rate_today(
    engine: Engine, database_url: str, set_env: SetEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    three_days_ago = (datetime.now(UTC) - timedelta(days=3)).date().isoformat()
    set_env(
        rate_limits="email=20000/h;sms=10/s",
        rate_warmup=f"email=50/s x2/d to 2000/s from {three_days_ago}",
    )
    code, out, _ = run(capsys, "stats", "--json")
    assert code == 0
    assert json.loads(out)["rate_limits"] == [
        {
            "provider": "email",
            "limits": ["20000/h", "400/s"],
            "warmup": {
                "spec": f"50/s x2/d to 2000/s from {three_days_ago}",
                "first_day": three_days_ago,
                "day": 3,
                "rate_today": "400/s",
                "ceiling": "2000/s",
            },
        },
        {"provider": "sms", "limits": ["10/s"], "warmup": None},
    ]
    code, out, _ = run(capsys, "stats")
    assert "email     20000/h, 400/s  day 3 of the warm-up: 400/s today, ceiling 2000/s" in out
