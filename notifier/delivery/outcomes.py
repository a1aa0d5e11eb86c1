"""What becomes of each claimed row: the pure decision from its attempt's result to its writes."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from notifier.delivery.retry import RetryPolicy, next_attempt_at
from notifier.logs import mask_recipient
from notifier.models import Attempt, Notification, RetryAt, truncate
from notifier.providers import Outcome, Permanent, Sent


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
    #: the longest back-off asked for, by channel, or by receiver (``Retry.scope``)
    throttled: dict[str, float] = field(default_factory=dict)

    def ids(self) -> list[int]:
        """Every row the plan writes, in id order."""
        retried = [r.id for r in (*self.retries, *self.deferred)]
        return sorted({*self.sent, *retried, *self.dead, *self.cancelled})

    def only(self, ids: Collection[int]) -> Plan:
        """The part of the plan that writes these rows."""
        keep = set(ids)
        return Plan(
            sent={i: m for i, m in self.sent.items() if i in keep},
            retries=[r for r in self.retries if r.id in keep],
            deferred=[r for r in self.deferred if r.id in keep],
            dead={i: e for i, e in self.dead.items() if i in keep},
            cancelled={i: e for i, e in self.cancelled.items() if i in keep},
        )

    def plainly(self, why: str) -> Plan:
        """The same transitions with nothing a provider or receiver wrote: no message ids, and
        ``why`` for every error. For a row whose outcome the database would not store."""
        return Plan(
            sent=dict.fromkeys(self.sent),
            retries=[RetryAt(r.id, why, r.at) for r in self.retries],
            deferred=[RetryAt(r.id, why, r.at) for r in self.deferred],
            dead=dict.fromkeys(self.dead, why),
            cancelled=dict.fromkeys(self.cancelled, why),
        )


def plan(
    claimed: Sequence[Notification],
    outcomes: Mapping[int, Result],
    policy: RetryPolicy,
    now: datetime,
    rand: Callable[[], float] = random.random,
    *,
    max_deferrals: int = 20,
) -> Plan:
    """Decide each row's next status from its result. Pure.

    ``Retry`` on the last allowed attempt becomes ``dead``, naming the attempts and the error.
    A throttled ``Retry`` (HTTP 429) is deferred by its ``retry_after`` (or the backoff) without
    counting the attempt, unless the row has been deferred ``max_deferrals`` times already
    (``dead``) or the wait would outlast its ``expires_at`` (``cancelled``). Every text that
    reaches the database is cleaned and bounded (``truncate``). Whatever a result holds, each
    row gets a decision: one that cannot be made makes that row ``dead``, naming why.
    """
    result = Plan()
    for n in claimed:
        try:
            _decide(result, n, outcomes[n.id], policy, now, rand, max_deferrals)
        except Exception as exc:
            result.dead[n.id] = truncate(f"deciding its outcome raised {type(exc).__name__}: {exc}")
    return result


def _decide(
    result: Plan,
    n: Notification,
    outcome: Result,
    policy: RetryPolicy,
    now: datetime,
    rand: Callable[[], float],
    max_deferrals: int,
) -> None:
    if isinstance(outcome, Sent):
        message_id = outcome.provider_message_id
        result.sent[n.id] = None if message_id is None else truncate(str(message_id), 255)
    elif isinstance(outcome, Permanent):
        result.dead[n.id] = truncate(outcome.error)
    elif isinstance(outcome, Cancelled):
        result.cancelled[n.id] = truncate(outcome.reason)
    elif outcome.throttled:
        error = truncate(outcome.error)
        wait = _wait(outcome.retry_after) or policy.delay(max(n.attempts, 1), rand)
        wait = min(wait, policy.cap)
        until = now + timedelta(seconds=wait)
        if n.deferrals >= max_deferrals:
            result.dead[n.id] = (
                f"gave up after being asked to slow down {n.deferrals + 1} times "
                f"(NOTIFIER_MAX_DEFERRALS={max_deferrals}); last answer: {error}"
            )
        elif n.expires_at is not None and until >= n.expires_at:
            result.cancelled[n.id] = f"expired while its receiver asked to wait: {error}"
        else:
            result.deferred.append(RetryAt(n.id, error, until))
        key = outcome.scope or n.channel
        result.throttled[key] = max(result.throttled.get(key, 0.0), wait)
    else:
        at = next_attempt_at(
            policy,
            attempts=n.attempts,
            max_attempts=n.max_attempts,
            now=now,
            retry_after=_wait(outcome.retry_after),
            rand=rand,
        )
        error = truncate(outcome.error)
        if at is None:
            result.dead[n.id] = f"gave up after {n.attempts} attempts; last error: {error}"
        else:
            result.retries.append(RetryAt(n.id, error, at))


def _wait(retry_after: float | None) -> float | None:
    """A provider's ``retry_after`` if it is a usable number of seconds (not NaN, not < 0)."""
    if retry_after is None or not retry_after >= 0:
        return None
    return float(retry_after)


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


def explain(rows: Sequence[Notification], decided: Plan, log: logging.Logger) -> None:
    """One log line for every row that did not go out this time, saying why: its id, channel,
    masked recipient, what became of it and the reason (a batch's summary only counts them)."""
    by_id = {n.id: n for n in rows}
    lines: list[tuple[int, str, int, str]] = [
        *((logging.INFO, "retry", r.id, r.error) for r in decided.retries),
        *((logging.INFO, "deferred", r.id, r.error) for r in decided.deferred),
        *((logging.WARNING, "dead", i, why) for i, why in decided.dead.items()),
        *((logging.INFO, "cancelled", i, why) for i, why in decided.cancelled.items()),
    ]
    for level, outcome, row_id, reason in lines:
        n = by_id.get(row_id)
        if n is None:
            continue
        recipient = mask_recipient(n.recipient)
        log.log(
            level,
            "notification %d %s: channel=%r recipient=%r reason=%s",
            n.id,
            outcome,
            n.channel,
            recipient,
            reason,
            extra={
                "event": "outcome",
                "id": n.id,
                "outcome": outcome,
                "channel": n.channel,
                "recipient": recipient,
                "reason": reason,
            },
        )
