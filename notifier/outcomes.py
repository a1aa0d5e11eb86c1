"""What becomes of each claimed row: the pure decision from its attempt's result to its writes."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from notifier.models import Notification
from notifier.providers import Outcome, Permanent, Sent
from notifier.providers.base import truncate
from notifier.retry import RetryPolicy, next_attempt_at
from notifier.store import Attempt, RetryAt


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Not sent, for good, by notifier's own decision: expired, or its guard said no."""

    reason: str


#: What became of one row's attempt: a provider's answer, or cancelled before the provider.
Result = Outcome | Cancelled


@dataclass(slots=True)
class Plan:
    """The writes that record one batch's outcomes."""

    sent: dict[int, str | None] = field(default_factory=dict)
    retries: list[RetryAt] = field(default_factory=list)
    #: throttled by the provider: pending again later, attempt not used up
    deferred: list[RetryAt] = field(default_factory=list)
    dead: dict[int, str] = field(default_factory=dict)
    cancelled: dict[int, str] = field(default_factory=dict)
    #: the longest back-off a provider asked for, by channel
    throttled: dict[str, float] = field(default_factory=dict)


def plan(
    claimed: Sequence[Notification],
    outcomes: Mapping[int, Result],
    policy: RetryPolicy,
    now: datetime,
    rand: Callable[[], float] = random.random,
) -> Plan:
    """Decide each row's next status from its result. Pure.

    ``Retry`` on the last allowed attempt becomes ``dead``, naming the attempts and the error.
    A throttled ``Retry`` (HTTP 429) is deferred by its ``retry_after`` (or the backoff) without
    counting the attempt.
    """
    result = Plan()
    for n in claimed:
        outcome = outcomes[n.id]
        if isinstance(outcome, Sent):
            result.sent[n.id] = outcome.provider_message_id
        elif isinstance(outcome, Permanent):
            result.dead[n.id] = truncate(outcome.error)
        elif isinstance(outcome, Cancelled):
            result.cancelled[n.id] = truncate(outcome.reason)
        elif outcome.throttled:
            wait = min(outcome.retry_after or policy.delay(max(n.attempts, 1), rand), policy.cap)
            result.deferred.append(
                RetryAt(n.id, truncate(outcome.error), now + timedelta(seconds=wait))
            )
            result.throttled[n.channel] = max(result.throttled.get(n.channel, 0.0), wait)
        else:
            at = next_attempt_at(
                policy,
                attempts=n.attempts,
                max_attempts=n.max_attempts,
                now=now,
                retry_after=outcome.retry_after,
                rand=rand,
            )
            error = truncate(outcome.error)
            if at is None:
                result.dead[n.id] = f"gave up after {n.attempts} attempts; last error: {error}"
            else:
                result.retries.append(RetryAt(n.id, error, at))
    return result


def attempts_of(
    rows: Sequence[Notification],
    decided: Plan,
    durations: Mapping[int, float],
    providers: Mapping[int, str],
) -> list[Attempt]:
    """The history entries of a batch's attempts, from its plan."""
    outcome: dict[int, tuple[str, str | None]] = {}
    for row_id in decided.sent:
        outcome[row_id] = ("sent", None)
    for r in decided.retries:
        outcome[r.id] = ("retry", r.error)
    for r in decided.deferred:
        outcome[r.id] = ("deferred", r.error)
    for row_id, why in decided.dead.items():
        outcome[row_id] = ("dead", why)
    for row_id, reason in decided.cancelled.items():
        outcome[row_id] = ("cancelled", reason)
    history = []
    for n in rows:
        kind, error = outcome[n.id]
        seconds = durations.get(n.id)
        ms = None if seconds is None else round(seconds * 1000)
        provider = providers.get(n.id)
        history.append(Attempt(n.id, n.attempts, n.channel, kind, error, ms, provider))
    return history
