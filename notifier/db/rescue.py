"""The rescue: rows whose worker died, or whose lease ran out, are taken back from it."""

from __future__ import annotations

from sqlalchemy import Connection, text

from notifier.db.workers import GONE, forget_gone

# A row is taken back when its lease ran out, or when the worker that claimed it is gone (its
# heartbeat lapsed, see ``notifier.db.workers``); a claimant without a heartbeat row (an older
# release) only by the lease. Served by the ``notifications_lease`` partial index (whose
# predicate, ``locked_until IS NOT NULL``, the query states) and the workers' key.
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
                 WHERE n.status = 'processing' AND n.locked_until IS NOT NULL
                   AND (n.locked_until < now() OR {GONE})
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
