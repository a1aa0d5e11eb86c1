"""The status webhook's SQL: its trigger's switch, and the outbox ``status_events``.

The trigger that writes events (migration 0015) is switched by ``notifier_status_webhook``, a
function the migration made, since only the table's owner may enable or disable a trigger.
The outbox is worked like ``notifications``: a claim in one statement (``FOR UPDATE SKIP
LOCKED`` inside ``UPDATE ... RETURNING``) that counts the attempt, and every later transition
guarded by the claim's token, so a sender that comes back after its lease changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection, text

from notifier.db.sql import number_array, rowcount, seconds_since

CONFIGURE = text("SELECT notifier_status_webhook(CAST(:events AS text[]))")

CONFIGURED = text("SELECT events FROM status_webhook")

CLAIM = text(
    """
    UPDATE status_events AS e
       SET status = 'processing', attempts = e.attempts + 1, claim_token = :token,
           locked_until = now() + make_interval(secs => :lease), updated_at = now()
      FROM (SELECT id FROM status_events
             WHERE status = 'pending' AND next_attempt_at <= now()
             ORDER BY next_attempt_at, id
             LIMIT :limit
               FOR UPDATE SKIP LOCKED) AS due
     WHERE e.id = due.id
    RETURNING e.id, e.notification_id, e.kind, e.state, e.channel, e.dedupe_key, e.detail,
              e.occurred_at, e.attempts
    """
)

# Events whose sender stopped before recording an answer: the POST may have been made, so the
# receiver may see it twice (it deduplicates by the event's id).
RESCUE = text(
    """
    UPDATE status_events
       SET status = CASE WHEN attempts >= :max_attempts THEN 'dead' ELSE 'pending' END,
           last_error = 'its sender stopped before recording the answer (after '
                        || attempts || ' attempts)',
           claim_token = NULL, locked_until = NULL, next_attempt_at = now(), updated_at = now()
     WHERE status = 'processing' AND locked_until < now()
    """
)

_CLAIMED = "e.id = r.id AND e.status = 'processing' AND e.claim_token = :token"

MARK_SENT = text(
    f"""
    UPDATE status_events AS e
       SET status = 'sent', claim_token = NULL, locked_until = NULL, last_error = NULL,
           updated_at = now()
      FROM unnest(CAST(:ids AS bigint[])) AS r(id)
     WHERE {_CLAIMED}
    """
)

SCHEDULE_RETRY = text(
    f"""
    UPDATE status_events AS e
       SET status = 'pending', next_attempt_at = r.at, last_error = r.error, claim_token = NULL,
           locked_until = NULL, updated_at = now()
      FROM unnest(CAST(:ids AS bigint[]), CAST(:ats AS timestamptz[]), CAST(:errors AS text[]))
           AS r(id, at, error)
     WHERE {_CLAIMED}
    """
)

MARK_DEAD = text(
    f"""
    UPDATE status_events AS e
       SET status = 'dead', last_error = r.error, claim_token = NULL, locked_until = NULL,
           updated_at = now()
      FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[])) AS r(id, error)
     WHERE {_CLAIMED}
    """
)

# Whether notifications wait to be sent, by the dispatcher's own partial index.
BACKLOG = text(
    "SELECT EXISTS (SELECT 1 FROM notifications WHERE status = 'pending'"
    " AND next_attempt_at <= now())"
)

# Each count served by a partial index; sent events are not counted (they are many, and purged).
COUNTS = text(
    f"""
    SELECT (SELECT count(*) FROM status_events WHERE status = 'pending'),
           (SELECT count(*) FROM status_events WHERE status = 'processing'),
           (SELECT count(*) FROM status_events WHERE status = 'dead'),
           (SELECT {seconds_since("min(created_at)")} FROM status_events
             WHERE status = 'pending')
    """
)

DEAD = text(
    """
    SELECT id, notification_id, kind, state, dedupe_key, attempts, last_error, occurred_at,
           updated_at
      FROM status_events
     WHERE status = 'dead'
     ORDER BY updated_at DESC, id DESC
     LIMIT :limit
    """
)

REQUEUE_DEAD = text(
    """
    UPDATE status_events
       SET status = 'pending', attempts = 0, next_attempt_at = now(), updated_at = now()
     WHERE status = 'dead'
       AND (CAST(:ids AS bigint[]) IS NULL OR id = ANY(CAST(:ids AS bigint[])))
    """
)

# Walked by id, like the notifications' purge: events are written in time order.
PURGE = text(
    """
    DELETE FROM status_events
     WHERE id IN (SELECT id FROM status_events
                   WHERE (status = 'sent' AND updated_at < :sent_before)
                      OR (status = 'dead' AND updated_at < :dead_before)
                   ORDER BY id LIMIT :limit
                     FOR UPDATE SKIP LOCKED)
    """
)


@dataclass(frozen=True, slots=True)
class Event:
    """One claimed event: what happened to which notification, and the attempt under way."""

    id: int
    notification_id: int
    #: ``status`` (sent, dead, cancelled) or ``delivery`` (delivered, bounced, ...)
    kind: str
    state: str
    channel: str
    dedupe_key: str | None
    #: the row's ``last_error`` or ``delivery_detail``
    detail: str | None
    occurred_at: datetime
    attempts: int


@dataclass(frozen=True, slots=True)
class Counts:
    pending: int
    processing: int
    dead: int
    #: how long the oldest pending event has waited, 0 when none waits
    oldest_pending_seconds: float


def configure(conn: Connection, events: Sequence[str]) -> bool:
    """Let the trigger write events for these states (none: disable it); whether it changed."""
    return bool(conn.execute(CONFIGURE, {"events": list(events)}).scalar_one())


def configured(conn: Connection) -> list[str]:
    """The states the trigger writes events for; empty when there is no trigger."""
    found = conn.execute(CONFIGURED).scalar()
    return list(found or [])


def claim(conn: Connection, token: UUID, limit: int, lease_seconds: float) -> list[Event]:
    """Up to ``limit`` due events, oldest first, each with its attempt counted."""
    params = {"token": token, "limit": limit, "lease": lease_seconds}
    return [Event(*row) for row in conn.execute(CLAIM, params).all()]


def rescue(conn: Connection, max_attempts: int) -> int:
    """Events held past their lease -> ``pending`` (``dead`` when out of attempts); how many."""
    return rowcount(conn.execute(RESCUE, {"max_attempts": max_attempts}))


def backlog(conn: Connection) -> bool:
    """Whether due notifications wait: the status webhook then yields to the dispatches."""
    return bool(conn.execute(BACKLOG).scalar_one())


def mark_sent(conn: Connection, token: UUID, ids: Sequence[int]) -> int:
    return rowcount(conn.execute(MARK_SENT, {"token": token, "ids": number_array(ids)}))


def schedule_retry(
    conn: Connection, token: UUID, retries: Sequence[tuple[int, datetime, str]]
) -> int:
    params = {
        "token": token,
        "ids": number_array(i for i, _, _ in retries),
        "ats": [at for _, at, _ in retries],
        "errors": [error for _, _, error in retries],
    }
    return rowcount(conn.execute(SCHEDULE_RETRY, params))


def mark_dead(conn: Connection, token: UUID, dead: Sequence[tuple[int, str]]) -> int:
    params = {
        "token": token,
        "ids": number_array(i for i, _ in dead),
        "errors": [error for _, error in dead],
    }
    return rowcount(conn.execute(MARK_DEAD, params))


def counts(conn: Connection) -> Counts:
    pending, processing, dead, oldest = conn.execute(COUNTS).one()
    return Counts(int(pending), int(processing), int(dead), float(oldest or 0.0))


def dead(conn: Connection, limit: int) -> list[dict[str, object]]:
    """The latest dead events, with why each was given up."""
    return [dict(r) for r in conn.execute(DEAD, {"limit": limit}).mappings()]


def requeue_dead(conn: Connection, ids: Sequence[int] | None) -> int:
    """Dead events (these, or all) -> ``pending``, due now, attempts reset; how many."""
    params = {"ids": None if ids is None else number_array(ids)}
    return rowcount(conn.execute(REQUEUE_DEAD, params))


def purge(conn: Connection, before: dict[str, datetime], limit: int) -> int:
    """Delete up to ``limit`` sent and dead events past their retention; how many."""
    params = {"sent_before": before["sent"], "dead_before": before["dead"], "limit": limit}
    return rowcount(conn.execute(PURGE, params))
