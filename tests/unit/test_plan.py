"""Turning providers' answers into the batch's writes."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notifier.delivery.outcomes import Attempt, Cancelled, Plan, Result, explain
from notifier.delivery.outcomes import plan as plan_sends
from notifier.delivery.retry import RetryPolicy
from notifier.models import AttemptOutcome, Decision, Notification
from notifier.providers import Permanent, Retry, Sent

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OUT = AttemptOutcome


def plan(rows: list[Notification], results: dict[int, Result], *args: Any, **kw: Any) -> Plan:
    """The plan of results that came without a send's times (as a check's or a template's)."""
    return plan_sends(rows, {i: Attempt(r) for i, r in results.items()}, *args, **kw)


def of(decided: Plan, outcome: AttemptOutcome) -> dict[int, Decision]:
    return {d.id: d for d in decided.decisions if d.outcome is outcome}


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
    outcomes: dict[int, Result] = {
        1: Sent("m-1"),
        2: Permanent("SMTP 550 5.1.1 no such user"),
        3: Retry("SMTP 451 try later"),
        4: Retry("HTTP 503"),
        5: Retry("timeout", retry_after=10),
    }
    result = plan(rows, outcomes, RetryPolicy(base=30, cap=3600, jitter=0), NOW)
    assert {i: d.message_id for i, d in of(result, OUT.sent).items()} == {1: "m-1"}
    assert {i: d.error for i, d in of(result, OUT.dead).items()} == {
        2: "SMTP 550 5.1.1 no such user",
        4: "gave up after 5 attempts; last error: HTTP 503",
        5: "gave up after 1 attempts; last error: timeout",
    }
    assert [(d.id, d.error, d.at) for d in of(result, OUT.retry).values()] == [
        (3, "SMTP 451 try later", NOW + timedelta(seconds=60))
    ]
    assert [d.id for d in result.decisions] == [1, 2, 3, 4, 5]  # one each, in the rows' order


def test_long_errors_are_bounded() -> None:
    result = plan([_n(1)], {1: Permanent("x" * 10_000)}, RetryPolicy(), NOW)
    assert len(of(result, OUT.dead)[1].error or "") <= 500


def test_each_row_that_did_not_go_out_gets_a_log_line_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = [
        replace(_n(1), channel="email", recipient="ann.secret@example.com"),
        replace(_n(2), channel="sms\nforged", recipient="+14155550100"),
        _n(3),
        _n(4),
    ]
    outcomes: dict[int, Result] = {
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


def test_a_decision_carries_its_send_whole() -> None:
    """What the sender handed back - duration, end, provider - reaches the decision that is
    written, and a recipient refused for good travels with it, as the address it went to."""
    rows = [_n(1), replace(_n(2), channel="email", recipient="gone@example.com"), _n(3)]
    sends = {
        1: Attempt(Sent("m-1"), seconds=0.0123, ended=1.7e9, provider="null"),
        2: Attempt(Permanent("SMTP 550 5.1.1 gone", suppress=True), 0.5, 1.7e9, "email_backup"),
        3: Attempt(Cancelled("expired")),
    }
    overrides = {"email": "qa@example.com"}
    decided = plan_sends(rows, sends, RetryPolicy(), NOW, overrides=overrides)
    assert decided.decisions == [
        Decision(1, "null", OUT.sent, message_id="m-1", provider="null", sent_at=1.7e9,
                 duration_ms=12),
        Decision(2, "email", OUT.dead, "SMTP 550 5.1.1 gone", provider="email_backup",
                 duration_ms=500, suppress=("email", "qa@example.com",
                                            "hard bounce (SMTP 550 5.1.1 gone)", "bounce")),
        Decision(3, "null", OUT.cancelled, "expired"),
    ]  # fmt: skip
    plain = decided.plainly("refused")
    assert [(d.outcome, d.error, d.message_id, d.suppress) for d in plain.decisions] == [
        (OUT.sent, None, None, None),
        (OUT.dead, "refused", None, None),
        (OUT.cancelled, "refused", None, None),
    ]
    assert [d.provider for d in plain.decisions] == ["null", "email_backup", None]
    assert decided.only({2, 3}).ids() == [2, 3]


def test_a_throttled_answer_defers_and_holds_back_its_scope() -> None:
    rows = [_n(1), _n(2), replace(_n(3), deferrals=20)]
    results: dict[int, Result] = {
        1: Retry("HTTP 429", retry_after=7, throttled=True, scope="webhook:a:443"),
        2: Retry("HTTP 429", retry_after=3, throttled=True),
        3: Retry("HTTP 429", retry_after=3, throttled=True),
    }
    decided = plan(rows, results, RetryPolicy(jitter=0), NOW, max_deferrals=20)
    assert {i: d.at for i, d in of(decided, OUT.deferred).items()} == {
        1: NOW + timedelta(seconds=7),
        2: NOW + timedelta(seconds=3),
    }
    assert (of(decided, OUT.dead)[3].error or "").startswith("gave up after being asked to slow")
    assert decided.throttled == {"webhook:a:443": 7.0, "null": 3.0}


def test_a_row_without_a_result_still_gets_a_decision() -> None:
    decided = plan([_n(1), _n(2)], {2: Sent()}, RetryPolicy(), NOW)
    assert [(d.id, d.outcome) for d in decided.decisions] == [(1, OUT.dead), (2, OUT.sent)]
    assert (decided.decisions[0].error or "").startswith("deciding its outcome raised KeyError")
