"""Turning providers' answers into the batch's writes."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from notifier.delivery.dispatcher import plan
from notifier.delivery.outcomes import Cancelled, explain
from notifier.delivery.retry import RetryPolicy
from notifier.models import Notification
from notifier.providers import Outcome, Permanent, Retry, Sent

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _n(id: int, attempts: int = 1, max_attempts: int = 5) -> Notification:
    return Notification(
        id=id,
        channel="null",
        recipient="x",
        subject=None,
        body=None,
        payload={},
        attempts=attempts,
        max_attempts=max_attempts,
        claim_token=uuid.uuid4(),
        created_at=NOW,
    )


def test_each_answer_goes_to_its_write() -> None:
    rows = [_n(1), _n(2), _n(3, attempts=2), _n(4, attempts=5), _n(5, max_attempts=1)]
    outcomes: dict[int, Outcome] = {
        1: Sent("m-1"),
        2: Permanent("SMTP 550 5.1.1 no such user"),
        3: Retry("SMTP 451 try later"),
        4: Retry("HTTP 503"),
        5: Retry("timeout", retry_after=10),
    }
    result = plan(rows, outcomes, RetryPolicy(base=30, cap=3600, jitter=0), NOW)
    assert result.sent == {1: "m-1"}
    assert result.dead == {
        2: "SMTP 550 5.1.1 no such user",
        4: "gave up after 5 attempts; last error: HTTP 503",
        5: "gave up after 1 attempts; last error: timeout",
    }
    assert [(r.id, r.error, r.at) for r in result.retries] == [
        (3, "SMTP 451 try later", NOW + timedelta(seconds=60))
    ]


def test_long_errors_are_bounded() -> None:
    result = plan([_n(1)], {1: Permanent("x" * 10_000)}, RetryPolicy(), NOW)
    assert len(result.dead[1]) <= 500


def test_each_row_that_did_not_go_out_gets_a_log_line_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = [
        replace(_n(1), channel="email", recipient="ann.secret@example.com"),
        replace(_n(2), channel="sms\nforged", recipient="+14155550100"),
        _n(3),
        _n(4),
    ]
    outcomes: dict[int, Outcome] = {
        1: Permanent("SMTP 550 5.1.1 no such user"),
        2: Retry("HTTP 503"),
        3: Sent("m-3"),
        4: Cancelled("expired"),
    }
    decided = plan(rows, outcomes, RetryPolicy(jitter=0), NOW)
    log = logging.getLogger("test.explain")
    with caplog.at_level(logging.INFO, logger="test.explain"):
        explain(rows, decided, log)
    lines = {r.id: r.getMessage() for r in caplog.records}  # type: ignore[attr-defined]
    assert set(lines) == {1, 2, 4}  # the sent row says nothing
    assert lines[1] == (
        "notification 1 dead: channel='email' recipient='a***@example.com'"
        " reason=SMTP 550 5.1.1 no such user"
    )
    assert lines[2].startswith("notification 2 retry: ")
    assert lines[2].endswith("reason=HTTP 503")
    assert "\n" not in lines[2]  # a producer's channel cannot forge a second log line
    assert "4155550100" not in lines[2]
    assert lines[4].endswith("reason=expired")
    levels = {r.id: r.levelno for r in caplog.records}  # type: ignore[attr-defined]
    assert levels == {1: logging.WARNING, 2: logging.INFO, 4: logging.INFO}
