"""What becomes of each claimed row: the pure decision from its attempt's result to its writes."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from notifier.delivery.retry import RetryPolicy, next_attempt_at
from notifier.logs import mask_recipient
from notifier.models import AttemptOutcome, Decision, Notification, Suppression, truncate
from notifier.providers import Outcome, Permanent, Sent


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Not sent, for good, by notifier's own decision: expired, or its guard said no."""

    reason: str


@dataclass(frozen=True, slots=True)
class Held:
    """Not sent yet, by what its person asked for (quiet hours): pending again until ``until``,
    its attempt given back."""

    until: datetime
    reason: str


#: What became of one row's attempt: a provider's answer, or decided before the provider.
Result = Outcome | Cancelled | Held


@dataclass(frozen=True, slots=True)
class Attempt:
    """One row's result as the sender hands it back: with how long its send took (seconds, the
    guard included), when it ended (Unix time: the row's ``sent_at``) and the provider that
    answered last. A result decided before any send (a check, a template) carries none."""

    result: Result
    seconds: float | None = None
    ended: float | None = None
    provider: str | None = None


@dataclass(slots=True)
class Plan:
    """A batch's decisions, one per row in the order the rows came, and the longest back-off
    asked for by channel or receiver (``Retry.scope``), which the limiter holds every worker to."""

    decisions: list[Decision] = field(default_factory=list)
    throttled: dict[str, float] = field(default_factory=dict)

    def count(self, outcome: AttemptOutcome) -> int:
        return sum(1 for d in self.decisions if d.outcome is outcome)

    def ids(self) -> list[int]:
        """Every row the plan writes, in id order."""
        return sorted(d.id for d in self.decisions)

    def only(self, ids: Collection[int]) -> Plan:
        """The part of the plan that writes these rows."""
        keep = set(ids)
        return Plan([d for d in self.decisions if d.id in keep])

    def plainly(self, why: str) -> Plan:
        """The same transitions with nothing a provider or receiver wrote: no message ids, no
        suppression, and ``why`` for every error. For a row whose outcome the database would
        not store."""
        return Plan(
            [
                replace(
                    d,
                    message_id=None,
                    error=None if d.outcome is AttemptOutcome.sent else why,
                    suppress=None,
                )
                for d in self.decisions
            ]
        )


def plan(
    claimed: Sequence[Notification],
    sends: Mapping[int, Attempt],
    policy: RetryPolicy,
    now: datetime,
    rand: Callable[[], float] = random.random,
    *,
    max_deferrals: int = 20,
    overrides: Mapping[str, str] | None = None,
) -> Plan:
    """Decide each row's next status from its result. Pure.

    ``Retry`` on the last allowed attempt becomes ``dead``, naming the attempts and the error.
    A throttled ``Retry`` (HTTP 429) is deferred by its ``retry_after`` (or the backoff) without
    counting the attempt, unless the row has been deferred ``max_deferrals`` times already
    (``dead``) or the wait would outlast its ``expires_at`` (``cancelled``). Every text that
    reaches the database is cleaned and bounded (``truncate``). Whatever a result holds, each
    row gets a decision: one that cannot be made makes that row ``dead``, naming why. A
    ``Permanent(suppress=True)`` carries its recipient to suppress: the address the message
    went to, the channel's override (``overrides``) when there is one.
    """
    result = Plan()
    for n in claimed:
        decision = Decision(n.id, n.channel, AttemptOutcome.dead)
        try:
            send = sends[n.id]
            decision.provider = send.provider
            decision.duration_ms = None if send.seconds is None else round(send.seconds * 1000)
            _decide(decision, n, send.result, policy, now, rand, max_deferrals, result.throttled)
            if decision.outcome is AttemptOutcome.sent:
                decision.sent_at = send.ended
            elif isinstance(send.result, Permanent) and send.result.suppress:
                decision.suppress = _suppression(n, send.result, overrides or {})
        except Exception as exc:
            decision.outcome = AttemptOutcome.dead
            decision.error = truncate(f"deciding its outcome raised {type(exc).__name__}: {exc}")
        result.decisions.append(decision)
    return result


def _decide(
    d: Decision,
    n: Notification,
    outcome: Result,
    policy: RetryPolicy,
    now: datetime,
    rand: Callable[[], float],
    max_deferrals: int,
    throttled: dict[str, float],
) -> None:
    if isinstance(outcome, Sent):
        message_id = outcome.provider_message_id
        d.outcome = AttemptOutcome.sent
        d.message_id = None if message_id is None else truncate(str(message_id), 255)
    elif isinstance(outcome, Permanent):
        d.outcome, d.error = AttemptOutcome.dead, truncate(outcome.error)
    elif isinstance(outcome, Cancelled):
        d.outcome, d.error = AttemptOutcome.cancelled, truncate(outcome.reason)
    elif isinstance(outcome, Held):
        if n.expires_at is not None and outcome.until >= n.expires_at:
            d.outcome = AttemptOutcome.cancelled
            d.error = truncate(f"expired: it would have waited past expires_at; {outcome.reason}")
        else:
            d.outcome, d.error, d.at = AttemptOutcome.held, truncate(outcome.reason), outcome.until
    elif outcome.throttled:
        error = truncate(outcome.error)
        wait = _wait(outcome.retry_after) or policy.delay(max(n.attempts, 1), rand)
        wait = min(wait, policy.cap)
        until = now + timedelta(seconds=wait)
        if n.deferrals >= max_deferrals:
            d.outcome, d.error = (
                AttemptOutcome.dead,
                (
                    f"gave up after being asked to slow down {n.deferrals + 1} times "
                    f"(NOTIFIER_MAX_DEFERRALS={max_deferrals}); last answer: {error}"
                ),
            )
        elif n.expires_at is not None and until >= n.expires_at:
            d.outcome = AttemptOutcome.cancelled
            d.error = f"expired while its receiver asked to wait: {error}"
        else:
            d.outcome, d.error, d.at = AttemptOutcome.deferred, error, until
        key = outcome.scope or n.channel
        throttled[key] = max(throttled.get(key, 0.0), wait)
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
            d.outcome = AttemptOutcome.dead
            d.error = f"gave up after {n.attempts} attempts; last error: {error}"
        else:
            d.outcome, d.error, d.at = AttemptOutcome.retry, error, at


def _suppression(n: Notification, refused: Permanent, overrides: Mapping[str, str]) -> Suppression:
    """The entry that keeps anything more from going to a recipient refused for good."""
    return (
        n.channel,
        overrides.get(n.channel, n.recipient),
        truncate(f"hard bounce ({refused.error})"),
        "invalid" if n.channel == "push" else "bounce",
    )


def _wait(retry_after: float | None) -> float | None:
    """A provider's ``retry_after`` if it is a usable number of seconds (not NaN, not < 0)."""
    if retry_after is None or not retry_after >= 0:
        return None
    return float(retry_after)


def explain(rows: Sequence[Notification], decided: Plan, log: logging.Logger) -> None:
    """One log line for every row that did not go out this time, saying why: its id, channel,
    masked recipient, what became of it and the reason (a batch's summary only counts them)."""
    by_id = {n.id: n for n in rows}
    lines = [
        (logging.WARNING if d.outcome is AttemptOutcome.dead else logging.INFO, d)
        for d in decided.decisions
        if d.outcome is not AttemptOutcome.sent
    ]
    for level, d in lines:
        n = by_id.get(d.id)
        if n is None:
            continue
        outcome, reason = d.outcome.value, d.error
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
