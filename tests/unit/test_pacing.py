"""Which rows of a batch may start, which wait, and which are held back: decided without a
database, against a limiter that answers from memory as the shared one answers from Redis."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from notifier.delivery.pacing import LIMITER_PACE, Pacing, SendingPaused
from notifier.models import Notification
from notifier.providers import Provider
from notifier.settings import Settings

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Tokens:
    """A limiter with ``left`` sends per channel now and ``holds`` on scopes."""

    def __init__(self, left: dict[str, int], holds: dict[str, float] | None = None) -> None:
        self.left = left
        self.holds = holds or {}
        self.blocked: dict[str, float] = {}

    def acquire(self, provider: str, count: int) -> tuple[int, float]:
        granted = min(count, self.left.get(provider, count))
        self.left[provider] = self.left.get(provider, count) - granted
        return granted, 0.001

    def block(self, provider: str, seconds: float) -> None:
        self.blocked[provider] = seconds

    def held(self, scopes: Sequence[str]) -> dict[str, float]:
        return {s: self.holds[s] for s in scopes if s in self.holds}


class Broken(Tokens):
    def acquire(self, provider: str, count: int) -> tuple[int, float]:
        raise ConnectionError("Redis went away")

    def block(self, provider: str, seconds: float) -> None:
        raise ConnectionError("Redis went away")

    def held(self, scopes: Sequence[str]) -> dict[str, float]:
        raise ConnectionError("Redis went away")


class Plain(Provider):
    channel = "null"


class ByHost(Provider):
    channel = "webhook"

    def throttle_scope(self, notification: Notification) -> str | None:
        return f"webhook:{notification.recipient}"


def _n(id: int, channel: str = "null", recipient: str = "x") -> Notification:
    return Notification(
        id, channel, recipient, None, None, {}, 1, 5, uuid.uuid4(), NOW
    )  # fmt: skip


def _pacing(limiter: Tokens, gate: object = None) -> Pacing:
    chains: dict[str, list[Provider]] = {
        "webhook": [ByHost(Settings())],
        "null": [Plain(Settings())],
    }
    return Pacing(limiter, chains, gate if callable(gate) else lambda: None)


def test_each_channel_gets_what_its_limit_grants_and_the_rest_waits() -> None:
    rows = [_n(1, "email"), _n(2, "sms"), _n(3, "email"), _n(4, "email")]
    granted, waiting, pause = _pacing(Tokens({"email": 2, "sms": 0})).grant(rows)
    assert [n.id for n in granted] == [1, 3]
    assert sorted(n.id for n in waiting) == [2, 4]
    assert pause == LIMITER_PACE  # the limiter's 1 ms is no reason to ask 50 times as often


def test_a_closed_gate_or_an_unreachable_limiter_pauses_sending() -> None:
    def closed() -> None:
        raise SendingPaused("Redis unreachable")

    with pytest.raises(SendingPaused, match="Redis unreachable"):
        _pacing(Tokens({}), closed).grant([_n(1)])
    with pytest.raises(SendingPaused, match="rate limiter unavailable"):
        _pacing(Broken({})).grant([_n(1)])


def test_rows_of_a_receiver_that_asked_to_wait_are_held_back_by_what_is_left() -> None:
    rows = [_n(1, "webhook", "a"), _n(2, "webhook", "b"), _n(3), _n(4, "webhook", "a")]
    limiter = Tokens({}, holds={"webhook:a": 12.5})
    rest, holds = _pacing(limiter).held_back(rows)
    assert [n.id for n in rest] == [2, 3]
    assert holds == {12.5: [1, 4]}
    assert _pacing(Tokens({})).held_back(rows) == (rows, {})
    unscoped = [replace(n, channel="null") for n in rows]
    assert _pacing(Broken({})).held_back(unscoped) == (unscoped, {})  # Redis not even asked
    with pytest.raises(SendingPaused):
        _pacing(Broken({})).held_back(rows)


def test_a_limiter_that_cannot_block_costs_only_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    limiter = Tokens({})
    _pacing(limiter).block({"webhook:a": 30.0, "email": 2.0})
    assert limiter.blocked == {"webhook:a": 30.0, "email": 2.0}
    _pacing(Broken({})).block({"email": 2.0})
    assert "could not hold email back for 2s" in caplog.text
