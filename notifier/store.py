"""All of notifier's SQL, one function per intent. Nothing else in the package talks to the driver.

Every transition out of ``processing`` is guarded by the status and the claim token it expects,
and returns the number of rows it changed: a worker that comes back after its rows were rescued
and claimed again changes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from uuid import UUID

import psycopg
from psycopg.abc import Buffer
from psycopg.types.datetime import TimestamptzLoader
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from notifier.models import (
    MAX_NAME_LENGTH,
    MAX_RECIPIENT_LENGTH,
    MAX_SUBJECT_LENGTH,
    Notification,
)
from notifier.settings import get_settings
from notifier.worker_store import GONE, forget_gone

# What a claim reads of each row. Whatever a producer wrote, reading it cannot fail and cannot
# cost more than the limits: long texts come back cut one character past their limit (the check
# then names the limit), a body over ``max_body_bytes`` and a payload stored larger than
# ``payload_read_limit`` do not come back at all (only their sizes do), and the payload comes as
# text, parsed row by row in Python (``_decode``). Timestamps are read by ``_SafeTimestamptz``.
_RETURNING = """
    n.id, n.channel, left(n.recipient, %(text_cap)s), left(n.subject, %(subject_cap)s),
    CASE WHEN octet_length(n.body) <= %(max_body)s THEN n.body END, octet_length(n.body),
    CASE WHEN pg_column_size(n.payload) <= %(payload_cap)s THEN n.payload::text END,
    pg_column_size(n.payload), n.attempts, n.max_attempts, n.created_at, n.dedupe_key,
    n.priority, left(n.guard, %(name_cap)s), n.expires_at, left(n.template, %(name_cap)s),
    left(n.locale, %(name_cap)s), n.deferrals
"""
_CLAIM_LIMITS = {
    "text_cap": MAX_RECIPIENT_LENGTH + 1,
    "subject_cap": MAX_SUBJECT_LENGTH + 1,
    "name_cap": MAX_NAME_LENGTH + 1,
}

# Run on the driver's cursor (a batch's rows become Notifications without a result layer between).
CLAIM_DUE = f"""
    UPDATE notifications AS n
       SET status = 'processing',
           attempts = n.attempts + 1,
           claim_token = %(token)s,
           claimed_by = %(worker)s,
           locked_until = now() + make_interval(secs => %(lease_seconds)s),
           updated_at = now()
      FROM (SELECT id
              FROM notifications
             WHERE status = 'pending' AND next_attempt_at <= now()
             ORDER BY priority DESC, next_attempt_at, id
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED) AS due
     WHERE n.id = due.id
    RETURNING {_RETURNING}
"""

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

# A row is taken back when its lease ran out, or when the worker that claimed it is gone (its
# heartbeat lapsed, see ``worker_store``); a claimant without a heartbeat row (an older release)
# only by the lease. Served by the ``notifications_lease`` partial index and the workers' key.
RESCUE_EXPIRED = text(
    f"""
    WITH rescued AS (
        UPDATE notifications AS n
           SET status = CASE WHEN n.attempts >= n.max_attempts THEN 'dead' ELSE 'pending' END,
               rescues = n.rescues + 1,
               locked_until = NULL,
               next_attempt_at = now(),
               updated_at = now(),
               last_error = CASE WHEN expired.silent IS NULL THEN 'lease expired: worker '
                                 ELSE 'worker gone: ' END
                            || coalesce(n.claimed_by, '?')
                            || CASE WHEN expired.silent IS NULL THEN ''
                                    ELSE ' sent no heartbeat for ' || expired.silent || 's and'
                               END
                            || ' stopped before recording the outcome of attempt '
                            || n.attempts || ' (it may have been delivered)'
                            || CASE WHEN n.attempts >= n.max_attempts
                                    THEN '; attempts used up' ELSE '' END
          FROM (SELECT n.id,
                       CASE WHEN n.locked_until >= now()
                            THEN round(extract(epoch FROM now() - w.last_seen))::bigint
                       END AS silent
                  FROM notifications n LEFT JOIN workers w ON w.name = n.claimed_by
                 WHERE n.status = 'processing' AND (n.locked_until < now() OR {GONE})
                 ORDER BY n.locked_until
                 LIMIT :limit
                   FOR UPDATE OF n SKIP LOCKED) AS expired
         WHERE n.id = expired.id
        RETURNING n.id, n.status, n.attempts, n.claimed_by, n.channel, n.last_error
    ), history AS (
        INSERT INTO notification_attempts
               (notification_id, attempt, worker, channel, outcome, error)
        SELECT id, attempts, coalesce(claimed_by, '?'), channel, 'rescued', last_error
          FROM rescued
    )
    SELECT id, status FROM rescued
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

COUNT_BY_STATUS = text(
    "SELECT status, channel, count(*) FROM notifications GROUP BY status, channel"
    " ORDER BY status, channel"
)

GAUGES = text(
    """
    SELECT (SELECT count(*) FROM notifications WHERE status = 'processing'),
           (SELECT count(*) FROM notifications
             WHERE status = 'dead' AND updated_at > now() - interval '1 hour')
    """
)

OLDEST_DUE = text(
    """
    SELECT extract(epoch FROM now() - min(next_attempt_at))::float8, count(*)
      FROM notifications
     WHERE status = 'pending' AND next_attempt_at <= now()
    """
)

ENQUEUE = """
    INSERT INTO notifications
           (channel, recipient, subject, body, payload, dedupe_key, max_attempts, priority,
            next_attempt_at, expires_at, guard, template, locale)
    VALUES (:channel, :recipient, :subject, :body, CAST(:payload AS jsonb), :dedupe_key,
            :max_attempts, :priority, coalesce(CAST(:send_at AS timestamptz), now()),
            CAST(:expires_at AS timestamptz), :guard, :template, :locale)
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
"""

ID_BY_DEDUPE_KEY = "SELECT id FROM notifications WHERE dedupe_key = :dedupe_key"

# A claimed row can be cancelled too: its worker checks again just before sending, and its
# later outcome write, guarded by status, changes nothing.
CANCEL_BY_KEY = """
    UPDATE notifications
       SET status = 'cancelled', updated_at = now(), locked_until = NULL,
           last_error = :reason
     WHERE dedupe_key = :dedupe_key AND status IN ('pending', 'processing')
    RETURNING id
"""

CANCEL_BY_ID = """
    UPDATE notifications
       SET status = 'cancelled', updated_at = now(), locked_until = NULL,
           last_error = :reason
     WHERE id = :id AND status IN ('pending', 'processing')
    RETURNING id
"""

NEXT_WAKE = text(
    """
    SELECT extract(epoch FROM min(next_attempt_at))::float8
      FROM notifications
     WHERE status = 'pending' AND next_attempt_at > now()
    """
)

#: The channel the ``notifications_wake`` trigger notifies on every INSERT of pending rows.
WAKE_CHANNEL = "notifier_wake"


# --- the engine --------------------------------------------------------------------------------


#: Connections an engine keeps open, and how many more it may open when they are all busy: the
#: most one process's engine holds (counted in ``budget``).
POOL_SIZE, POOL_OVERFLOW = 2, 2


@lru_cache(maxsize=1)
def engine() -> Engine:
    """The process's engine, created on first use (after a prefork worker has forked)."""
    return make_engine(get_settings().database_url)


def make_engine(url: str) -> Engine:
    """An engine whose connections read any timestamp a producer can write."""
    eng = create_engine(
        url,
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        pool_pre_ping=True,  # a connection killed by a database restart is replaced, not used
        pool_recycle=1800,
        connect_args={"connect_timeout": 10, "application_name": "notifier"},
    )
    event.listen(eng, "connect", _on_connect)
    return eng


def dispose_engine(*, close: bool = False) -> None:
    """Forget the process's engine; right after fork, without closing the parent's sockets."""
    if engine.cache_info().currsize:
        engine().dispose(close=close)
    engine.cache_clear()


# --- the dispatcher's statements ---------------------------------------------------------------


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
        "ids": _number_array(sent),
        "sent_at": _number_array((sent_at or {}).get(i) for i in sent),
        "message_ids": list(sent.values()),
        "providers": [providers.get(i) for i in sent],
    }
    if history is None:
        return _rowcount(conn.execute(MARK_SENT, params))
    worker, durations = history
    params.update(worker=worker, durations=_number_array(durations.get(i) for i in sent))
    return int(conn.execute(MARK_SENT_RECORDED, params).scalar_one())


def schedule_retry(conn: Connection, token: UUID, retries: Sequence[RetryAt]) -> int:
    """``processing`` -> ``pending`` at a later time, with the failure's reason."""
    if not retries:
        return 0
    return _rowcount(
        conn.execute(
            SCHEDULE_RETRY,
            {
                "token": token,
                "ids": [r.id for r in retries],
                "errors": [r.error for r in retries],
                "next_attempts": [r.at for r in retries],
            },
        )
    )


def mark_dead(conn: Connection, token: UUID, dead: Mapping[int, str]) -> int:
    """``processing`` -> ``dead`` with the reason a producer can act on."""
    if not dead:
        return 0
    return _rowcount(
        conn.execute(MARK_DEAD, {"token": token, "ids": list(dead), "errors": list(dead.values())})
    )


def mark_cancelled(conn: Connection, token: UUID, cancelled: Mapping[int, str]) -> int:
    """``processing`` -> ``cancelled`` (a guard said no, or the row expired), with the reason."""
    if not cancelled:
        return 0
    params = {"token": token, "ids": list(cancelled), "reasons": list(cancelled.values())}
    return _rowcount(conn.execute(MARK_CANCELLED, params))


def recheck(conn: Connection, token: UUID, ids: Iterable[int]) -> tuple[set[int], set[int]]:
    """Of these claimed rows: those still held by this claim (not cancelled meanwhile), and
    among them those whose campaign is paused."""
    held: set[int] = set()
    paused: set[int] = set()
    for row_id, is_paused in conn.execute(
        RECHECK, {"token": token, "ids": _number_array(ids)}
    ).all():
        held.add(int(row_id))
        if is_paused:
            paused.add(int(row_id))
    return held, paused


def defer(conn: Connection, token: UUID, deferrals: Sequence[RetryAt]) -> int:
    """``processing`` -> ``pending`` at a later time without using up the attempt: the
    provider asked us to slow down (a 429), which says nothing about the message."""
    if not deferrals:
        return 0
    return _rowcount(
        conn.execute(
            DEFER,
            {
                "token": token,
                "ids": [r.id for r in deferrals],
                "errors": [r.error for r in deferrals],
                "next_attempts": [r.at for r in deferrals],
            },
        )
    )


def park_claimed(conn: Connection, token: UUID, ids: Iterable[int]) -> int:
    """Hand back claimed rows of a paused campaign: pending, due only when it is resumed."""
    id_list = list(ids)
    if not id_list:
        return 0
    return _rowcount(conn.execute(PARK_CLAIMED, {"token": token, "ids": id_list}))


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
    return _rowcount(conn.execute(RELEASE, params))


def rescue_expired(conn: Connection, *, limit: int = 1000) -> dict[str, int]:
    """Take back rows whose lease ran out or whose worker is gone (its heartbeat lapsed): to
    ``pending``, or ``dead`` if out of attempts.

    Safe to run in several places at once (``SKIP LOCKED``). Each rescued row's ``rescues`` is
    incremented: its last attempt may have reached the provider before the worker died. Workers
    gone for a day are forgotten.
    """
    rows = conn.execute(RESCUE_EXPIRED, {"limit": limit}).all()
    forget_gone(conn)
    counts = {"pending": 0, "dead": 0}
    for _, status in rows:
        counts[status] += 1
    return counts


# --- what operators and producers use ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt's entry in the history."""

    id: int
    attempt: int
    channel: str
    outcome: str
    error: str | None
    duration_ms: int | None
    #: the provider that answered, when one was called
    provider: str | None = None


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


@dataclass(frozen=True, slots=True)
class RetryAt:
    id: int
    error: str
    at: datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    by_status_channel: list[tuple[str, str, int]]
    due: int
    lag_seconds: float


def queue_stats(conn: Connection) -> QueueStats:
    """Rows by status and channel; due pending rows and the age of the oldest (the lag)."""
    counts = [(s, c, int(n)) for s, c, n in conn.execute(COUNT_BY_STATUS).all()]
    lag, due = conn.execute(OLDEST_DUE).one()
    return QueueStats(counts, int(due), float(lag or 0.0))


@dataclass(frozen=True, slots=True)
class Gauges:
    due: int
    lag_seconds: float
    processing: int
    dead_last_hour: int


def gauges(conn: Connection) -> Gauges:
    """What the metrics endpoint reads at every scrape; each served by a partial index."""
    lag, due = conn.execute(OLDEST_DUE).one()
    processing, dead = conn.execute(GAUGES).one()
    return Gauges(int(due), float(lag or 0.0), int(processing), int(dead))


ProducerConnection = Connection | psycopg.Connection[Any]


def enqueue_row(conn: ProducerConnection, values: Mapping[str, Any]) -> tuple[int, bool]:
    """Insert one notification; ``(id, True)`` if new, ``(id, False)`` if its key existed."""
    row = _producer_execute(conn, ENQUEUE, values)
    if row is not None:
        return int(row[0]), True
    existing = _producer_execute(conn, ID_BY_DEDUPE_KEY, {"dedupe_key": values["dedupe_key"]})
    if existing is None:  # the conflicting row was deleted between the two statements
        return enqueue_row(conn, values)
    return int(existing[0]), False


def cancel_by_key(conn: ProducerConnection, dedupe_key: str, reason: str) -> int | None:
    """Cancel the unsent row with this key; its id, or ``None`` if none was waiting."""
    row = _producer_execute(conn, CANCEL_BY_KEY, {"dedupe_key": dedupe_key, "reason": reason})
    return None if row is None else int(row[0])


def cancel_by_id(conn: ProducerConnection, row_id: int, reason: str) -> bool:
    """Cancel this row if it has not been sent; whether it was."""
    return _producer_execute(conn, CANCEL_BY_ID, {"id": row_id, "reason": reason}) is not None


# --- wake-ups ----------------------------------------------------------------------------------


def listen(database_url: str) -> psycopg.Connection[Any]:
    """A connection of its own, LISTENing for the wake-ups of inserted rows."""
    conn = psycopg.connect(
        make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False),
        autocommit=True,
        connect_timeout=10,
        application_name="notifier-wake",
    )
    conn.execute(f"LISTEN {WAKE_CHANNEL}")
    return conn


def next_wake(conn: Connection) -> float | None:
    """Unix time at which the earliest delayed pending row falls due, if any."""
    value = conn.execute(NEXT_WAKE).scalar()
    return None if value is None else float(value)


# --- plumbing ----------------------------------------------------------------------------------


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


class _SafeTimestamptz(TimestamptzLoader):
    """Reads ``infinity``, ``-infinity`` and years past 9999 as the latest and earliest times
    Python has, instead of failing the statement: a producer may write ``'infinity'`` into
    ``expires_at`` to mean "never", and one such row must not stop every claim."""

    def load(self, data: Buffer) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text_ = bytes(data).decode(errors="replace")
            early = text_.startswith("-") or text_.endswith(" BC")
            return (datetime.min if early else datetime.max).replace(tzinfo=UTC)


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    if isinstance(dbapi_connection, psycopg.Connection):
        dbapi_connection.adapters.register_loader("timestamptz", _SafeTimestamptz)


_NAMED = re.compile(r"(?<![:\w]):(\w+)")


def _producer_execute(
    conn: ProducerConnection, sql: str, params: Mapping[str, Any]
) -> tuple[Any, ...] | None:
    """Run one statement on a SQLAlchemy or a psycopg connection, inside its transaction."""
    if isinstance(conn, Connection):
        row = conn.execute(text(sql), dict(params)).first()
        return None if row is None else tuple(row)
    with conn.cursor() as cur:
        cur.execute(_NAMED.sub(r"%(\1)s", sql), dict(params))
        return cur.fetchone()


def _rowcount(result: Any) -> int:
    return int(result.rowcount)


def _number_array(values: Iterable[float | None]) -> str:
    """A numeric array as one literal for ``CAST(... AS bigint[])`` and the like: psycopg dumps
    a list element by element, which every batch would pay for each of its rows."""
    return "{" + ",".join("NULL" if v is None else repr(v) for v in values) + "}"


def driver(conn: Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under ``conn``, for COPY and for results read without a layer
    between; it is inside ``conn``'s transaction."""
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError("notifier needs the psycopg 3 driver (postgresql+psycopg://)")
    return raw
