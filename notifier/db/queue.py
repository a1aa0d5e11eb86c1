"""The dispatcher's statements: claim, the guarded transitions out of ``processing``, rescue.

Every transition out of ``processing`` is guarded by the status and the claim token it expects,
and returns the number of rows it changed: a worker that comes back after its rows were rescued
and claimed again changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from sqlalchemy import Connection, text

from notifier.db.engine import driver, driver_errors
from notifier.db.profiles import CLAIM_PROFILE, addressing
from notifier.db.sql import for_driver, number_array, rowcount, text_array
from notifier.models import (
    MAX_NAME_LENGTH,
    MAX_RECIPIENT_LENGTH,
    MAX_SUBJECT_LENGTH,
    AttemptOutcome,
    Decision,
    Notification,
)

V = TypeVar("V")

# What a claim reads of each row. Whatever a producer wrote, reading it cannot fail and cannot
# cost more than the limits: long texts come back cut one character past their limit (the check
# then names the limit), a body over ``max_body_bytes`` and a payload stored larger than
# ``payload_read_limit`` do not come back at all (only their sizes do), and the payload comes as
# text, parsed row by row in Python (``_decode``). Timestamps are read by ``_SafeTimestamptz``.
_RETURNING = f"""
    n.id, n.channel, left(n.recipient, :text_cap), left(n.subject, :subject_cap),
    CASE WHEN octet_length(n.body) <= :max_body THEN n.body END, octet_length(n.body),
    CASE WHEN pg_column_size(n.payload) <= :payload_cap THEN n.payload::text END,
    pg_column_size(n.payload), n.attempts, n.max_attempts, n.created_at, n.dedupe_key,
    n.priority, left(n.guard, :name_cap), n.expires_at, left(n.template, :name_cap),
    left(n.locale, :name_cap), n.deferrals, n.category, n.profile, {CLAIM_PROFILE}
"""
_CLAIM_LIMITS = {
    "text_cap": MAX_RECIPIENT_LENGTH + 1,
    "subject_cap": MAX_SUBJECT_LENGTH + 1,
    "name_cap": MAX_NAME_LENGTH + 1,
}

# Run on the driver's cursor, hence ``for_driver``: a batch's rows become Notifications without a
# result layer between. The claim reads ``notification_queue`` (migration 0029), whose entries
# it deletes: ``notifications_due`` keeps a claimed row's entry until ``notifications`` is
# vacuumed, and every claim would read past it. An entry and its row are locked together, and
# either skipped if the other is locked: a claim never waits, so neither on a producer's open
# transaction nor in a deadlock with it. The triggers keep each entry equal to its row's key;
# an entry that no longer matches its row (left by a write with triggers off: the row has left
# ``pending``, or its priority or time changed) is stale: deleted, and nothing claimed for it.
# The rows are updated where the lock found them (``ctid = ANY``: a TID scan, which no planner
# estimate can turn into a scan of the table), not looked up again by their keys: one descent
# of the primary key fewer a row. A row its lock found changed since the statement began
# (another transaction wrote it and committed meanwhile) is locked in its new version, which
# the statement's snapshot cannot see: the update passes it over, so its entry is kept for the
# next claim, and only the entries of rows claimed, and of stale ones, are deleted.
CLAIM_DUE = for_driver(
    f"""
    WITH due AS (
        SELECT q.ctid AS entry, r.ctid AS found, q.id,
               r.status = 'pending' AND r.priority = q.priority
               AND r.next_attempt_at = q.next_attempt_at AS matches
          FROM notification_queue q JOIN notifications r ON r.id = q.id
         WHERE q.next_attempt_at <= now()
         ORDER BY q.priority DESC, q.next_attempt_at, q.id
         LIMIT :limit
           FOR UPDATE OF q, r SKIP LOCKED
    ), claimed AS (
        UPDATE notifications AS n
           SET status = 'processing',
               attempts = n.attempts + 1,
               claim_token = :token,
               claimed_by = :worker,
               locked_until = now() + make_interval(secs => :lease_seconds),
               updated_at = now()
         WHERE n.ctid = ANY (ARRAY(SELECT found FROM due WHERE matches))
        RETURNING {_RETURNING}
    ), taken AS (
        DELETE FROM notification_queue
         WHERE ctid = ANY (ARRAY(SELECT entry FROM due
                                  WHERE NOT matches OR id IN (SELECT id FROM claimed)))
    )
    SELECT * FROM claimed
"""
)

# Run before ``CLAIM_DUE`` in its transaction. Right after a bulk INSERT, before anything has
# analyzed the table, the planner guesses that a third of it is due and reads every due row
# (a bitmap scan) to sort them for the LIMIT: 400 ms a claim with a million rows waiting, until
# autovacuum's ANALYZE comes round. Without a sort to choose, the only plan left reads
# ``notification_queue_due`` in its order and stops at the LIMIT: 7 ms. Local to the transaction.
CLAIM_PLAN = "SET LOCAL enable_sort = off"

# Run before ``RECORD_OUTCOMES`` in its transaction. The planner cannot know how many rows a
# claim token holds (it estimates one), so it would read them first - with a sequential scan
# of the whole table, or, on a small table never analyzed, a walk of its whole primary key in
# a nested loop that compares each row with every outcome of the group (200 ms for 1,000
# outcomes beside 10,000 rows, against 10) - instead of looking each of the group's rows up by
# its key. ``RECORD_OUTCOMES`` names the group's keys (``n.id = ANY``), and without those scans
# and nested loops to choose, the plan left reads the rows by those keys and joins them with
# the outcomes by a hash, whatever the table's size or statistics. One statement each: a
# pipeline sends no statement lists.
RECORD_PLAN = (
    "SET LOCAL enable_seqscan = off",
    "SET LOCAL enable_bitmapscan = off",
    "SET LOCAL enable_nestloop = off",
)

# One guarded statement records a whole group of outcomes, from parallel arrays (as River's
# JobSetStateIfRunningMany does with its ``state text[]``): each row's way out of
# ``processing`` by the name of its outcome, what it carries, and, when a worker is named, its
# attempt appended to the history. A column with nothing in it travels as an empty array
# (``unnest`` pads it with NULLs): a group of plain sends parses no outcome names, errors or
# retry times, and no outcome means ``sent``. ``sent_at`` is when the provider accepted the row
# (the worker's clock, as Unix time), never later than now(). A sent row keeps no
# ``last_error``: an earlier attempt's error stays in the history, not beside ``sent``. A
# deferred row gives its attempt back and counts a deferral instead; the history keeps the
# attempt's number.
RECORD_OUTCOMES = for_driver(
    """
    WITH changed AS (
        UPDATE notifications AS n
           SET status = CASE WHEN v.outcome IN ('retry', 'deferred', 'held') THEN 'pending'
                             ELSE v.outcome END,
               updated_at = now(), locked_until = NULL,
               sent_at = CASE WHEN v.outcome = 'sent'
                              THEN least(to_timestamp(v.sent_at), now())
                              ELSE n.sent_at END,
               provider_message_id = CASE WHEN v.outcome = 'sent' THEN v.message_id
                                          ELSE n.provider_message_id END,
               provider = CASE WHEN v.outcome = 'sent' THEN v.provider ELSE n.provider END,
               last_error = CASE WHEN v.outcome = 'sent' THEN NULL ELSE v.error END,
               next_attempt_at = coalesce(to_timestamp(v.next_at), n.next_attempt_at),
               attempts = n.attempts
                          - CASE WHEN v.outcome IN ('deferred', 'held') AND n.attempts > 0
                                 THEN 1 ELSE 0 END,
               deferrals = n.deferrals + CASE WHEN v.outcome = 'deferred' THEN 1 ELSE 0 END
          FROM (SELECT id, coalesce(outcome, 'sent') AS outcome, error, next_at, message_id,
                       provider, sent_at, duration_ms
                  FROM unnest(CAST(:ids AS bigint[]), CAST(:outcomes AS text[]),
                              CAST(:errors AS text[]), CAST(:next_at AS float8[]),
                              CAST(:message_ids AS text[]), CAST(:providers AS text[]),
                              CAST(:sent_at AS float8[]), CAST(:durations AS int[]))
                       AS u(id, outcome, error, next_at, message_id, provider, sent_at,
                            duration_ms)) AS v
         WHERE n.id = v.id AND n.id = ANY (CAST(:ids AS bigint[]))
           AND n.status = 'processing' AND n.claim_token = :token
        RETURNING n.id, n.attempts + CASE WHEN v.outcome IN ('deferred', 'held') THEN 1 ELSE 0 END
                  AS attempt, n.channel, v.outcome, v.error, v.duration_ms, v.provider
    ), history AS (
        INSERT INTO notification_attempts
               (notification_id, attempt, worker, channel, outcome, error, duration_ms, provider)
        SELECT id, attempt, CAST(:worker AS text), channel, outcome, error, duration_ms, provider
          FROM changed
         WHERE CAST(:worker AS text) IS NOT NULL
    )
    SELECT count(*) FROM changed
    """
)

# Whether each row is still held is read, not filtered on, so the batch's rows are found by
# their key alone. Filtering on ``status = 'processing'`` once let the planner join the key
# with the lease index, which keeps an entry for every row version ever claimed until a
# vacuum: a look grew from 2 to 15 us a row over a million-row drain.
RECHECK = for_driver(
    """
    SELECT n.id, n.status = 'processing' AND n.claim_token = :token AS held,
           coalesce(c.status = 'paused', false) AS paused
      FROM notifications n LEFT JOIN campaigns c ON c.id = n.campaign_id
     WHERE n.id = ANY(CAST(:ids AS bigint[]))
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
        measure is taken afterwards (``notifier.delivery.checks.payload_size``)."""
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
    with (
        driver_errors(conn),
        send_claim(driver(conn), limit, lease_seconds, token, worker, limits) as cur,
    ):
        return claimed(cur)


def send_claim(
    conn: psycopg.Connection[Any],
    limit: int,
    lease_seconds: float,
    token: UUID,
    worker: str,
    limits: ReadLimits = ReadLimits(),
) -> psycopg.Cursor[Notification]:
    """``claim_due``'s statements, executed on the driver's connection (queued, in a
    ``trips.one_trip``): its cursor, for ``claimed`` to read."""

    def notification(values: Sequence[Any]) -> Notification:
        (id_, channel, recipient, subject, body, body_bytes, payload, payload_bytes, attempts,
         max_attempts, created_at, dedupe_key, priority, guard, expires_at, template, locale,
         deferrals, category, profile_id, profile_read) = values  # fmt: skip
        decoded, defect = _decode(payload, payload_bytes, body_bytes, limits)
        recipient, profile, unaddressed = addressing(channel, recipient, profile_id, profile_read)
        if profile is not None and locale is None:
            locale = profile.locale
        return Notification(
            id_, channel, recipient, subject, body, decoded, attempts, max_attempts, token,
            created_at, dedupe_key, priority, guard, expires_at, template, locale, deferrals,
            defect or unaddressed, category, profile,
        )  # fmt: skip

    params = claim_parameters(token, worker, lease_seconds, limit, limits)
    conn.execute(CLAIM_PLAN)
    cur = conn.cursor(row_factory=lambda _cursor: notification)
    cur.execute(CLAIM_DUE, params)
    return cur


def claimed(cur: psycopg.Cursor[Notification]) -> list[Notification]:
    """The rows a claim's cursor holds, by priority, then id."""
    rows = cur.fetchall()
    rows.sort(key=lambda n: (-n.priority, n.id))
    return rows


def record_outcomes(
    conn: Connection, token: UUID, outcomes: Sequence[Decision], worker: str | None = None
) -> int:
    """Each row still held by ``token`` leaves ``processing`` as its ``Decision`` says, in one
    statement; how many rows it changed. With ``worker`` named, the changed rows' attempts are
    appended to ``notification_attempts`` by the same statement."""
    with driver_errors(conn):
        return recorded(send_record(driver(conn), token, outcomes, worker))


def send_record(
    conn: psycopg.Connection[Any],
    token: UUID,
    outcomes: Sequence[Decision],
    worker: str | None = None,
) -> psycopg.Cursor[Any] | None:
    """``record_outcomes``' statements, executed on the driver's connection (queued, in a
    ``trips.one_trip``): its cursor for ``recorded``, or ``None`` when there is nothing."""
    if not outcomes:
        return None
    sent = AttemptOutcome.sent
    params = {
        "token": token,
        "worker": worker,
        "ids": number_array(d.id for d in outcomes),
        "outcomes": _column(
            text_array, [None if d.outcome is sent else d.outcome.value for d in outcomes]
        ),
        "errors": _column(text_array, [d.error for d in outcomes]),
        "next_at": _column(
            number_array, [None if d.at is None else d.at.timestamp() for d in outcomes]
        ),
        "message_ids": _column(text_array, [d.message_id for d in outcomes]),
        "providers": _column(text_array, [d.provider for d in outcomes]),
        "sent_at": _column(number_array, [d.sent_at for d in outcomes]),
        "durations": _column(number_array, [d.duration_ms for d in outcomes]),
    }
    for setting in RECORD_PLAN:
        conn.execute(setting)
    return conn.execute(RECORD_OUTCOMES, params)


def recorded(cur: psycopg.Cursor[Any] | None) -> int:
    """How many rows a ``send_record`` changed."""
    found = cur.fetchone() if cur is not None else None
    return int(found[0]) if found is not None else 0


def _column(literal: Callable[[list[V]], str], values: list[V]) -> str:
    """An array literal for one column of ``unnest``: empty when every value is NULL."""
    return literal(values) if any(v is not None for v in values) else "{}"


def recheck(conn: Connection, token: UUID, ids: Iterable[int]) -> tuple[set[int], set[int]]:
    """Of these claimed rows: those still held by this claim (not cancelled meanwhile), and
    among them those whose campaign is paused."""
    with driver_errors(conn):
        return rechecked(send_recheck(driver(conn), token, ids))


def send_recheck(
    conn: psycopg.Connection[Any], token: UUID, ids: Iterable[int]
) -> psycopg.Cursor[Any]:
    """``recheck``'s statement, executed on the driver's connection (queued, in a
    ``trips.one_trip``): its cursor, for ``rechecked``."""
    return conn.execute(RECHECK, {"token": token, "ids": number_array(ids)})


def rechecked(cur: psycopg.Cursor[Any]) -> tuple[set[int], set[int]]:
    """What a ``send_recheck`` found: the rows still held, and the held ones paused."""
    held: set[int] = set()
    paused: set[int] = set()
    for row_id, is_held, is_paused in cur.fetchall():
        if is_held:
            held.add(int(row_id))
            if is_paused:
                paused.add(int(row_id))
    return held, paused


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
    if payload == "{}":  # the column's default, and most rows': no parser needed
        return {}, None
    try:
        return json.loads(payload), None
    except RecursionError:
        return {}, "payload is nested too deeply to be read; keep it to a few levels"
    except ValueError as exc:  # jsonb always holds JSON; kept for what Python cannot hold
        return {}, f"payload cannot be read: {exc}"
