"""The retry policy, with the clock and the random draw in the test's hands."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from notifier.delivery.retry import RetryPolicy, next_attempt_at

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [(1, 24, 30), (2, 48, 60), (3, 96, 120), (7, 1536, 1920), (8, 2880, 3600), (40, 2880, 3600)],
)
def test_delay_doubles_until_the_cap(attempt: int, low: float, high: float) -> None:
    policy = RetryPolicy(base=30, cap=3600, jitter=0.2)
    assert policy.bounds(attempt) == pytest.approx((low, high))
    assert policy.delay(attempt, rand=lambda: 0.0) == pytest.approx(high)
    assert policy.delay(attempt, rand=lambda: 0.999999) == pytest.approx(low, rel=1e-5)


def test_no_jitter_is_exact() -> None:
    policy = RetryPolicy(base=1, cap=10, jitter=0)
    assert [policy.delay(a, rand=lambda: 0.5) for a in (1, 2, 3, 4, 5)] == [1, 2, 4, 8, 10]


def test_gives_up_when_attempts_are_used_up() -> None:
    policy = RetryPolicy()
    assert next_attempt_at(policy, attempts=5, max_attempts=5, now=NOW) is None
    assert next_attempt_at(policy, attempts=1, max_attempts=1, now=NOW) is None
    at = next_attempt_at(policy, attempts=4, max_attempts=5, now=NOW, rand=lambda: 0.0)
    assert at == NOW + timedelta(seconds=240)


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    policy = RetryPolicy(base=30, cap=600, jitter=0)
    longer = next_attempt_at(policy, attempts=1, max_attempts=5, now=NOW, retry_after=120)
    shorter = next_attempt_at(policy, attempts=1, max_attempts=5, now=NOW, retry_after=5)
    huge = next_attempt_at(policy, attempts=1, max_attempts=5, now=NOW, retry_after=86400)
    assert longer == NOW + timedelta(seconds=120)
    assert shorter == NOW + timedelta(seconds=30)
    assert huge == NOW + timedelta(seconds=600)


@pytest.mark.parametrize("kwargs", [{"base": 0}, {"cap": -1}, {"jitter": 1.0}, {"jitter": -0.1}])
def test_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError):
        RetryPolicy().bounds(0)
