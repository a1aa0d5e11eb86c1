"""The console's limits on password guesses, as a pure policy over a clock held still."""

from __future__ import annotations

from notifier.console.limits import CAPACITY, Attempts, retry_after
from tests.console_server import Clock


def test_sprayed_names_and_clients_keep_memory_bounded() -> None:
    attempts = Attempts({"alice"}, clock=Clock(), capacity=100)
    for _ in range(5):
        assert attempts.begin("alice", "10.0.0.1") == 0
    for i in range(5000):
        attempts.begin(f"made-up-{i}\n", f"10.1.{i // 250}.{i % 250}")
    assert attempts.sizes() == (1, 100, 100)
    # the configured user's record survived the spray: its guesses are still limited
    assert attempts.begin("alice", "10.9.9.9") > 0


def test_the_default_capacity_is_modest() -> None:
    # A record is a name (at most 200 characters) and two numbers: well under 1 KiB each.
    assert CAPACITY <= 10_000


def test_an_attempt_counts_before_its_password_is_checked() -> None:
    """So that a burst of concurrent guesses cannot pass before the first is counted."""
    attempts = Attempts({"alice"}, clock=Clock())
    began = [attempts.begin("alice", "10.0.0.1") for _ in range(20)]
    assert began[:5] == [0] * 5
    assert all(w > 0 for w in began[5:])


def test_a_success_clears_the_name_and_the_client() -> None:
    clock = Clock()
    attempts = Attempts({"alice"}, clock=clock)
    for _ in range(5):
        attempts.begin("alice", "10.0.0.1")
    clock.advance(1)
    assert attempts.begin("alice", "10.0.0.1") == 0
    attempts.succeeded("alice", "10.0.0.1")
    assert [attempts.begin("alice", "10.0.0.1") for _ in range(5)] == [0] * 5


def test_the_name_waits_at_most_5_s_and_the_client_30() -> None:
    clock = Clock()
    attempts = Attempts({"alice"}, clock=clock)
    failures = 0
    while failures < 40:
        wait = attempts.begin("alice", "10.0.0.1")
        failures += wait == 0
        clock.advance(wait)
    assert attempts.begin("alice", "10.0.0.1") == 30
    assert attempts.begin("alice", "10.0.0.2") == 5


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert [retry_after(w) for w in (0.01, 1.0, 1.2, 29.9)] == [1, 1, 2, 30]
