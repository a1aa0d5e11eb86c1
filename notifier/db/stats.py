"""The SQL of what the queue is doing: rows by status and channel, the due rows and their lag,
the gauges, and the outcomes per minute.

Part of ``notifier.db``, the package that talks to the driver. ``notifier stats``, ``notifier
health``, the metrics endpoint and the console's overview all read these.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from notifier.db.sql import seconds_since

COUNT_BY_STATUS = text(
    "SELECT status, channel, count(*) FROM notifications GROUP BY status, channel"
    " ORDER BY status, channel"
)

# A producer may write any time (``-infinity`` included) into next_attempt_at: the age is
# clamped, so one such row shows as a long lag instead of failing every monitor's read.
_DUE = f"""
    SELECT count(*) AS due, {seconds_since("min(next_attempt_at)")} AS lag_seconds
      FROM notifications
     WHERE status = 'pending' AND next_attempt_at <= now()
"""

DUE = text(_DUE)

# Each served by a partial index (notifications_due, _lease, _dead).
GAUGES = text(
    f"""
    SELECT d.due, d.lag_seconds,
           (SELECT count(*) FROM notifications
             WHERE status = 'processing' AND locked_until IS NOT NULL) AS processing,
           (SELECT count(*) FROM notifications
             WHERE status = 'processing' AND locked_until < now() + interval '1 minute')
               AS leases_expiring,
           (SELECT count(*) FROM notifications
             WHERE status = 'dead' AND updated_at > now() - interval '1 hour') AS dead_last_hour
      FROM ({_DUE}) AS d
    """
)

# One row per minute, oldest first; the last is the minute under way. One range read through
# notification_attempts_at (a BRIN index, migration 0015), counted by minute.
OUTCOMES_PER_MINUTE = text(
    """
    SELECT m.minute, coalesce(c.sent, 0), coalesce(c.retried, 0), coalesce(c.dead, 0)
      FROM generate_series(date_trunc('minute', now()) - make_interval(mins => :minutes),
                           date_trunc('minute', now()), interval '1 minute') AS m(minute)
      LEFT JOIN (SELECT date_trunc('minute', at) AS minute,
                        count(*) FILTER (WHERE outcome = 'sent') AS sent,
                        count(*) FILTER (WHERE outcome = 'retry') AS retried,
                        count(*) FILTER (WHERE outcome = 'dead') AS dead
                   FROM notification_attempts
                  WHERE at >= date_trunc('minute', now()) - make_interval(mins => :minutes)
                  GROUP BY 1) AS c USING (minute)
     ORDER BY m.minute
    """
)


RESCUED_LAST_HOUR = text(
    "SELECT count(*) FROM notification_attempts"
    " WHERE at > now() - interval '1 hour' AND outcome = 'rescued'"
)


def counts(conn: Connection) -> list[tuple[str, str, int]]:
    """``(status, channel, rows)``, by status then channel."""
    return [(s, c, int(n)) for s, c, n in conn.execute(COUNT_BY_STATUS).all()]


@dataclass(frozen=True, slots=True)
class QueueStats:
    by_status_channel: list[tuple[str, str, int]]
    due: int
    lag_seconds: float


def queue_stats(conn: Connection) -> QueueStats:
    """Rows by status and channel; due pending rows and the age of the oldest (the lag)."""
    due, lag = conn.execute(DUE).one()
    return QueueStats(counts(conn), int(due), float(lag or 0.0))


@dataclass(frozen=True, slots=True)
class Gauges:
    due: int
    #: ``None`` when no row is due
    lag_seconds: float | None
    processing: int
    #: claimed rows whose lease runs out within a minute
    leases_expiring: int
    dead_last_hour: int


def gauges(conn: Connection) -> Gauges:
    """What the metrics endpoint reads at every scrape, and the console's overview."""
    due, lag, processing, expiring, dead = conn.execute(GAUGES).one()
    return Gauges(
        int(due), None if lag is None else float(lag), int(processing), int(expiring), int(dead)
    )


def rescued_last_hour(conn: Connection) -> int:
    """Rows the rescue took back from a worker that stopped mid-send, in the last hour.

    Read from the attempt history, which the rescue's own statement writes (a ``rescued``
    attempt per row, ``notifier.db.rescue``), so the figure is exact whichever process ran it;
    one range read through notification_attempts_at, as ``outcomes_per_minute``."""
    return int(conn.execute(RESCUED_LAST_HOUR).scalar_one())


def outcomes_per_minute(conn: Connection, minutes: int) -> list[tuple[datetime, int, int, int]]:
    """``(minute, sent, retry, dead)`` for the ``minutes`` whole minutes before this one and
    the minute under way, oldest first."""
    rows = conn.execute(OUTCOMES_PER_MINUTE, {"minutes": minutes}).all()
    return [(m, int(s), int(r), int(d)) for m, s, r, d in rows]
