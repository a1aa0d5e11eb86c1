"""The dispatcher's statements: claim, the guarded transitions out of ``processing``, rescue.

Every transition out of ``processing`` is guarded by the status and the claim token it expects,
and returns the number of rows it changed: a worker that comes back after its rows were rescued
and claimed again changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, TextClause, text

from notifier.db.engine import driver
from notifier.db.sql import for_driver, number_array, rowcount
from notifier.models import (
    MAX_NAME_LENGTH,
    MAX_RECIPIENT_LENGTH,
    MAX_SUBJECT_LENGTH,
    Attempt,
    Notification,
    RetryAt,
)

# What a claim reads of each row. Whatever a producer wrote, reading it cannot fail and cannot
# cost more than the limits: long texts come back cut one character past their limit (the check
# then names the limit), a body over ``max_body_bytes`` and a payload stored larger than
# ``payload_read_limit`` do not come back at all (only their sizes do), and the payload comes as
# text, parsed row by row in Python (``_decode``). Timestamps are read by ``_SafeTimestamptz``.
_RETURNING = """
    n.id, n.channel, left(n.recipient, :text_cap), left(n.subject, :subject_cap),
    CASE WHEN octet_length(n.body) <= :max_body THEN n.body END, octet_length(n.body),
    CASE WHEN pg_column_size(n.payload) <= :payload_cap THEN n.payload::text END,
    pg_column_size(n.payload), n.attempts, n.max_attempts, n.created_at, n.dedupe_key,
    n.priority, left(n.guard, :name_cap), n.expires_at, left(n.template, :name_cap),
    left(n.locale, :name_cap), n.deferrals
"""
_CLAIM_LIMITS = {
    "text_cap": MAX_RECIPIENT_LENGTH + 1,
    "subject_cap": MAX_SUBJECT_LENGTH + 1,
    "name_cap": MAX_NAME_LENGTH + 1,
}

# Run on the driver's cursor, hence ``for_driver``: a batch's rows become Notifications without a
# result layer between.
CLAIM_DUE = for_driver(
    f"""
    UPDATE notifications AS n
       SET status = 'processing',
           attempts = n.attempts + 1,
           claim_token = :token,
           claimed_by = :worker,
           locked_until = now() + make_interval(secs => :lease_seconds),
           updated_at = now()
      FROM (SELECT id
              FROM notifications
             WHERE status = 'pending' AND next_attempt_at <= now()
             ORDER BY priority DESC, next_attempt_at, id
             LIMIT :limit
               FOR UPDATE SKIP LOCKED) AS due
     WHERE n.id = due.id
    RETURNING {_RETURNING}
"""
)

# ``sent_at`` is when the provider accepted the row (the worker's clock, as Unix time), not when
# the batch was recorded; never later than the database's now().
MARK_SENT = text(
    """
    UPDATE notifications AS n
       SET status = 'sent', sent_at = least(to_timestamp(v.sent_at), now()), updated_at = now(),
           locked_until = NULL, provider_message_id = v.provider_message_id,
           provider = v.provider
      FROM unnest(CAST(:ids AS bigint[]), CAST(:message_ids AS text[]),
                  CAST(:providers AS text[]), CAST(:sent_at AS float8[]))
           AS v(id, provider_message_id, provider, sent_at)
     WHERE n.id = v.id AND n.status = 'processing' AND n.claim_token = :token
    """
)

# The same, also appending each changed row's attempt to the history, in one statement: on the
# hot path the history costs no extra round trip and no second copy of the ids.
MARK_SENT_RECORDED = text(
    """
    WITH sent AS (
        UPDATE notifications AS n
           SET status = 'sent', sent_at = least(to_timestamp(v.sent_at), now()),
               updated_at = now(), locked_until = NULL,
               provider_message_id = v.provider_message_id, provider = v.provider
          FROM unnest(CAST(:ids AS bigint[]), CAST(:message_ids AS text[]),
                      CAST(:providers AS text[]), CAST(:sent_at AS float8[]),
                      CAST(:durations AS int[]))
               AS v(id, provider_message_id, provider, sent_at, duration_ms)
         WHERE n.id = v.id AND n.status = 'processing' AND n.claim_token = :token
        RETURNING n.id, n.attempts, n.channel, v.provider, v.duration_ms
    ), history AS (
        INSERT INTO notification_attempts
               (notification_id, attempt, worker, channel, outcome, duration_ms, provider)
        SELECT id, attempts, :worker, channel, 'sent', duration_ms, provider FROM sent
    )
    SELECT count(*) FROM sent
    """
)

SCHEDULE_RETRY = text(
    """
    UPDATE notifications AS n
       SET status = 'pending', updated_at = now(), locked_until = NULL,
           next_attempt_at = v.next_attempt_at, last_error = v.error
      FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[]),
                  CAST(:next_attempts AS timestamptz[])) AS v(id, error, next_attempt_at)
     WHERE n.id = v.id AND n.status = 'processing' AND n.claim_token = :token
    """
)

MARK_DEAD = text(
    """
    UPDATE notifications AS n
       SET status = 'dead', updated_at = now(), locked_until = NULL, last_error = v.error
      FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[])) AS v(id, error)
     WHERE n.id = v.id AND n.status = 'processing' AND n.claim_token = :token
    """
)

MARK_CANCELLED = text(
    """
    UPDATE notifications AS n
       SET status = 'cancelled', updated_at = now(), locked_until = NULL, last_error = v.reason
      FROM unnest(CAST(:ids AS bigint[]), CAST(:reasons AS text[])) AS v(id, reason)
     WHERE n.id = v.id AND n.status = 'processing' AND n.claim_token = :token
    """
)

RECHECK = text(
    """
    SELECT n.id, coalesce(c.status = 'paused', false) AS paused
      FROM notifications n LEFT JOIN campaigns c ON c.id = n.campaign_id
     WHERE n.id = ANY(CAST(:ids AS bigint[])) AND n.status = 'processing'
       AND n.claim_token = :token
    """
)

DEFER = text(
    """
    UPDATE notifications AS n
       SET status = 'pending', updated_at = now(), locked_until = NULL,
           attempts = greatest(n.attempts - 1, 0), deferrals = n.deferrals + 1,
           next_attempt_at = v.next_attempt_at, last_error = v.error
      FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[]),
                  CAST(:next_attempts AS timestamptz[])) AS v(id, error, next_attempt_at)
     WHERE n.id = v.id AND n.status = 'processing' AND n.claim_token = :token
    """
)

PARK_CLAIMED = text(
    """
    UPDATE notifications
       SET status = 'pending', updated_at = now(), locked_until = NULL,
           attempts = greatest(attempts - 1, 0), next_attempt_at = 'infinity'
     WHERE id = ANY(CAST(:ids AS bigint[])) AND status = 'processing' AND claim_token = :token
    """
)

RELEASE = text(
    """
    UPDATE notifications
       SET status = 'pending', updated_at = now(), locked_until = NULL,
           attempts = greatest(attempts - 1, 0),
           next_attempt_at = coalesce(CAST(:not_before AS timestamptz), next_attempt_at),
           last_error = coalesce(CAST(:reason AS text), last_error)
     WHERE id = ANY(CAST(:ids AS bigint[])) AND status = 'processing' AND claim_token = :token
    """
)

RECORD_ATTEMPTS = text(
    """
    INSERT INTO notification_attempts
           (notification_id, attempt, worker, channel, outcome, error, duration_ms, provider)
    SELECT v.id, v.attempt, :worker, v.channel, v.outcome, v.error, v.duration_ms, v.provider
      FROM unnest(CAST(:ids AS bigint[]), CAST(:attempts AS int[]), CAST(:channels AS text[]),
                  CAST(:outcomes AS text[]), CAST(:errors AS text[]),
                  CAST(:durations AS int[]), CAST(:providers AS text[]))
           AS v(id, attempt, channel, outcome, error, duration_ms, provider)
    """
)


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """The most a claim reads of one row's body and payload (see ``_RETURNING``)."""

    max_body_bytes: int = 1_048_576
    max_payload_bytes: int = 65_536

    @property
    def payload_read_limit(self) -> int:
        """Stored (binary, maybe compressed) size past which a payload is not read at all.

        Well above ``max_payload_bytes``, since jsonb's binary form is larger than its JSON
        text for small values: a payload within the limit is always read, and the exact
        measure is taken afterwards (``validation.payload_size``)."""
        return 8 * self.max_payload_bytes + 1024


def claim_parameters(
    token: UUID, worker: str, lease_seconds: float, limit: int, limits: ReadLimits
) -> dict[str, Any]:
    """What ``CLAIM_DUE`` is run with (the benchmarks bind exactly this too)."""
    return {
        "token": token,
        "worker": worker,
        "lease_seconds": lease_seconds,
        "limit": limit,
        "max_body": limits.max_body_bytes,
        "payload_cap": limits.payload_read_limit,
        **_CLAIM_LIMITS,
    }


def claim_due(
    conn: Connection,
    *,
    limit: int,
    lease_seconds: float,
    token: UUID,
    worker: str,
    limits: ReadLimits = ReadLimits(),
) -> list[Notification]:
    """Claim up to ``limit`` due pending rows for this worker, in one statement.

    A row is due when ``status = 'pending'`` and ``next_attempt_at <= now()``; higher
    ``priority`` first, then the longest-waiting, then by id. Rows locked by another claim are
    skipped, never waited on. Each claimed row becomes ``processing`` with ``attempts`` counting
    the attempt about to be made, the given claim token, and a lease of ``lease_seconds``.

    No row can make the claim fail: what cannot be read of a row (see ``_RETURNING``) comes
    back as its ``defect``, and the dispatcher gives that row up alone.
    """

    def notification(values: Sequence[Any]) -> Notification:
        (id_, channel, recipient, subject, body, body_bytes, payload, payload_bytes, attempts,
         max_attempts, created_at, dedupe_key, priority, guard, expires_at, template, locale,
         deferrals) = values  # fmt: skip
        decoded, defect = _decode(payload, payload_bytes, body_bytes, limits)
        return Notification(
            id_, channel, recipient, subject, body, decoded, attempts, max_attempts, token,
            created_at, dedupe_key, priority, guard, expires_at, template, locale, deferrals,
            defect,
        )  # fmt: skip

    params = claim_parameters(token, worker, lease_seconds, limit, limits)
    with driver(conn).cursor(row_factory=lambda _cursor: notification) as cur:
        claimed = cur.execute(CLAIM_DUE, params).fetchall()
    claimed.sort(key=lambda n: (-n.priority, n.id))
    return claimed


def mark_sent(
    conn: Connection,
    token: UUID,
    sent: Mapping[int, str | None],
    providers: Mapping[int, str],
    history: tuple[str, Mapping[int, int | None]] | None = None,
    sent_at: Mapping[int, float] | None = None,
) -> int:
    """``processing`` -> ``sent`` for the rows still held by ``token``, naming the provider.

    ``sent_at`` has the Unix time each row's send ended; a row without one is stamped now.

    With ``history`` (the worker's name and each row's send duration in ms), the attempts are
    appended to ``notification_attempts`` by the same statement.
    """
    if not sent:
        return 0
    params: dict[str, Any] = {
        "token": token,
        "ids": number_array(sent),
        "sent_at": number_array((sent_at or {}).get(i) for i in sent),
        "message_ids": list(sent.values()),
        "providers": [providers.get(i) for i in sent],
    }
    if history is None:
        return rowcount(conn.execute(MARK_SENT, params))
    worker, durations = history
    params.update(worker=worker, durations=number_array(durations.get(i) for i in sent))
    return int(conn.execute(MARK_SENT_RECORDED, params).scalar_one())


def schedule_retry(conn: Connection, token: UUID, retries: Sequence[RetryAt]) -> int:
    """``processing`` -> ``pending`` at a later time, with the failure's reason."""
    return _pending_again(conn, SCHEDULE_RETRY, token, retries)


def mark_dead(conn: Connection, token: UUID, dead: Mapping[int, str]) -> int:
    """``processing`` -> ``dead`` with the reason a producer can act on."""
    if not dead:
        return 0
    return rowcount(
        conn.execute(MARK_DEAD, {"token": token, "ids": list(dead), "errors": list(dead.values())})
    )


def mark_cancelled(conn: Connection, token: UUID, cancelled: Mapping[int, str]) -> int:
    """``processing`` -> ``cancelled`` (a guard said no, or the row expired), with the reason."""
    if not cancelled:
        return 0
    params = {"token": token, "ids": list(cancelled), "reasons": list(cancelled.values())}
    return rowcount(conn.execute(MARK_CANCELLED, params))


def recheck(conn: Connection, token: UUID, ids: Iterable[int]) -> tuple[set[int], set[int]]:
    """Of these claimed rows: those still held by this claim (not cancelled meanwhile), and
    among them those whose campaign is paused."""
    held: set[int] = set()
    paused: set[int] = set()
    for row_id, is_paused in conn.execute(
        RECHECK, {"token": token, "ids": number_array(ids)}
    ).all():
        held.add(int(row_id))
        if is_paused:
            paused.add(int(row_id))
    return held, paused


def defer(conn: Connection, token: UUID, deferrals: Sequence[RetryAt]) -> int:
    """``processing`` -> ``pending`` at a later time without using up the attempt: the
    provider asked us to slow down (a 429), which says nothing about the message."""
    return _pending_again(conn, DEFER, token, deferrals)


def _pending_again(
    conn: Connection, statement: TextClause, token: UUID, rows: Sequence[RetryAt]
) -> int:
    """Run ``SCHEDULE_RETRY`` or ``DEFER`` (same parameters) for ``rows``, if there are any."""
    if not rows:
        return 0
    params = {
        "token": token,
        "ids": [r.id for r in rows],
        "errors": [r.error for r in rows],
        "next_attempts": [r.at for r in rows],
    }
    return rowcount(conn.execute(statement, params))


def park_claimed(conn: Connection, token: UUID, ids: Iterable[int]) -> int:
    """Hand back claimed rows of a paused campaign: pending, due only when it is resumed."""
    id_list = list(ids)
    if not id_list:
        return 0
    return rowcount(conn.execute(PARK_CLAIMED, {"token": token, "ids": id_list}))


def release(
    conn: Connection,
    token: UUID,
    ids: Iterable[int],
    *,
    not_before: datetime | None = None,
    reason: str | None = None,
) -> int:
    """Hand claimed rows back to ``pending`` without using up the attempt their claim counted.

    For rows that were never sent: a worker stopping, a rate limit, an unreachable Redis.
    """
    id_list = list(ids)
    if not id_list:
        return 0
    params = {"token": token, "ids": id_list, "not_before": not_before, "reason": reason}
    return rowcount(conn.execute(RELEASE, params))


def record_attempts(conn: Connection, worker: str, attempts: Sequence[Attempt]) -> None:
    """Append a batch's attempts to ``notification_attempts``, in one statement."""
    if not attempts:
        return
    conn.execute(
        RECORD_ATTEMPTS,
        {
            "worker": worker,
            "ids": [a.id for a in attempts],
            "attempts": [a.attempt for a in attempts],
            "channels": [a.channel for a in attempts],
            "outcomes": [a.outcome for a in attempts],
            "errors": [a.error for a in attempts],
            "durations": [a.duration_ms for a in attempts],
            "providers": [a.provider for a in attempts],
        },
    )


def _decode(
    payload: str | None, payload_bytes: int, body_bytes: int | None, limits: ReadLimits
) -> tuple[Any, str | None]:
    """A claimed row's payload parsed, and what is wrong with its body or payload, if anything."""
    if body_bytes is not None and body_bytes > limits.max_body_bytes:
        return {}, (
            f"body is {body_bytes} bytes; at most {limits.max_body_bytes} allowed "
            "(NOTIFIER_MAX_BODY_BYTES): send a link to the content instead"
        )
    if payload is None:
        return {}, (
            f"payload is stored in {payload_bytes} bytes, far over the "
            f"{limits.max_payload_bytes} bytes allowed (NOTIFIER_MAX_PAYLOAD_BYTES)"
        )
    try:
        return json.loads(payload), None
    except RecursionError:
        return {}, "payload is nested too deeply to be read; keep it to a few levels"
    except ValueError as exc:  # jsonb always holds JSON; kept for what Python cannot hold
        return {}, f"payload cannot be read: {exc}"
