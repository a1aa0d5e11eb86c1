"""The SQL of the operators' bulk changes: requeue dead rows, cancel unsent ones, purge
finished ones. Part of ``notifier.db``, the package that talks to the driver.

Every bulk change runs in batches walked by id (``id > :after ORDER BY id LIMIT :limit``), each
batch its own short transaction whose rows are locked ``FOR UPDATE SKIP LOCKED``: a million
matching rows never sit under one statement's locks, and a worker is never made to wait.

Filters are bound parameters; a ``NULL`` one matches everything. Bulk changes only reach rows
that existed when their count was taken (``id <= :max_id``), so what the operator confirmed is
what changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

# --- what a bulk change counts from -------------------------------------------------------------

SNAPSHOT = text("SELECT coalesce(max(id), 0), now() FROM notifications")

# Also the console list's filter by campaign.
CAMPAIGN_ID = text("SELECT id FROM campaigns WHERE name = :name")

# --- requeue: dead rows back to pending -------------------------------------------------------

_DEAD = """
    status = 'dead' AND id <= :max_id
    AND (CAST(:ids AS bigint[]) IS NULL OR id = ANY(CAST(:ids AS bigint[])))
    AND (CAST(:channels AS text[]) IS NULL OR channel = ANY(CAST(:channels AS text[])))
    AND (CAST(:campaign_id AS bigint) IS NULL OR campaign_id = CAST(:campaign_id AS bigint))
    AND (CAST(:since AS timestamptz) IS NULL OR updated_at >= CAST(:since AS timestamptz))
    AND updated_at < CAST(:until AS timestamptz)
    AND (CAST(:error AS text) IS NULL
         OR last_error ILIKE '%' || CAST(:error AS text) || '%' ESCAPE '\\')
"""

COUNT_DEAD = text(f"SELECT count(*) FROM notifications WHERE {_DEAD}")

REQUEUE_DEAD = text(
    f"""
    UPDATE notifications AS n
       SET status = 'pending', attempts = 0, next_attempt_at = now(), locked_until = NULL,
           updated_at = now()
      FROM (SELECT id FROM notifications
             WHERE id > :after AND {_DEAD}
             ORDER BY id LIMIT :limit
               FOR UPDATE SKIP LOCKED) AS m
     WHERE n.id = m.id
    RETURNING n.id
    """
)

# --- bulk cancel: rows not sent yet ------------------------------------------------------------

_WAITING = """
    status = ANY(CAST(:statuses AS text[])) AND id <= :max_id
    AND (CAST(:channels AS text[]) IS NULL OR channel = ANY(CAST(:channels AS text[])))
    AND (CAST(:campaign_id AS bigint) IS NULL OR campaign_id = CAST(:campaign_id AS bigint))
    AND (CAST(:since AS timestamptz) IS NULL OR created_at >= CAST(:since AS timestamptz))
    AND (CAST(:until AS timestamptz) IS NULL OR created_at < CAST(:until AS timestamptz))
"""

COUNT_WAITING = text(f"SELECT count(*) FROM notifications WHERE {_WAITING}")

# A claimed row can be cancelled too, as with ``producers.CANCEL_BY_ID``: its worker looks again
# just before sending, and its outcome write, guarded by status, then changes nothing.
CANCEL_WAITING = text(
    f"""
    UPDATE notifications AS n
       SET status = 'cancelled', last_error = :reason, locked_until = NULL, updated_at = now()
      FROM (SELECT id FROM notifications
             WHERE id > :after AND {_WAITING}
             ORDER BY id LIMIT :limit
               FOR UPDATE SKIP LOCKED) AS m
     WHERE n.id = m.id
    RETURNING n.id
    """
)

# --- purge: finished rows past their retention --------------------------------------------------

# Only final statuses are named: pending and processing rows never match.
_EXPIRED = """
    (status = 'sent' AND updated_at < :sent_before)
    OR (status = 'dead' AND updated_at < :dead_before)
    OR (status = 'cancelled' AND updated_at < :cancelled_before)
"""

COUNT_EXPIRED = text(
    f"""
    SELECT status, count(*)
      FROM notifications n
     WHERE {_EXPIRED}
     GROUP BY status
    """
)

PURGE_EXPIRED = text(
    f"""
    WITH doomed AS (
        DELETE FROM notifications
         WHERE id IN (SELECT id FROM notifications
                       WHERE id > :after AND ({_EXPIRED})
                       ORDER BY id LIMIT :limit
                         FOR UPDATE SKIP LOCKED)
        RETURNING id, status
    )
    SELECT d.status, count(*), max(d.id)
      FROM doomed d
     GROUP BY d.status
    """
)


# --- functions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The table as a bulk change's count saw it: rows up to ``max_id``, at ``now``."""

    max_id: int
    now: datetime


def snapshot(conn: Connection) -> Snapshot:
    max_id, now = conn.execute(SNAPSHOT).one()
    return Snapshot(int(max_id), now)


def campaign_id(conn: Connection, name: str) -> int | None:
    """The campaign's id by its name; ``None`` if there is none."""
    value = conn.execute(CAMPAIGN_ID, {"name": name}).scalar()
    return None if value is None else int(value)


def count_dead(conn: Connection, params: dict[str, Any]) -> int:
    """Dead rows matching ``params`` (see ``_DEAD``)."""
    return int(conn.execute(COUNT_DEAD, params).scalar_one())


def requeue_dead(conn: Connection, params: dict[str, Any], after: int, limit: int) -> list[int]:
    """Up to ``limit`` matching dead rows above id ``after`` -> ``pending``, due now, with
    their attempts reset to 0; their ids. ``last_error`` keeps the reason they died."""
    return _ids(conn.execute(REQUEUE_DEAD, {**params, "after": after, "limit": limit}).all())


def count_waiting(conn: Connection, params: dict[str, Any]) -> int:
    """Unsent rows matching ``params`` (see ``_WAITING``)."""
    return int(conn.execute(COUNT_WAITING, params).scalar_one())


def cancel_waiting(
    conn: Connection, params: dict[str, Any], reason: str, after: int, limit: int
) -> list[int]:
    """Up to ``limit`` matching unsent rows above id ``after`` -> ``cancelled``; their ids."""
    values = {**params, "reason": reason, "after": after, "limit": limit}
    return _ids(conn.execute(CANCEL_WAITING, values).all())


def count_expired(conn: Connection, before: dict[str, datetime]) -> dict[str, int]:
    """What a purge with these cut-offs would delete: rows by status."""
    rows = conn.execute(COUNT_EXPIRED, _cutoffs(before)).all()
    return {s: int(n) for s, n in rows}


def purge_expired(
    conn: Connection, before: dict[str, datetime], after: int, limit: int
) -> tuple[dict[str, int], int]:
    """Delete up to ``limit`` finished rows above id ``after`` that finished before their
    status's cut-off (``updated_at``): ``(rows by status, highest id deleted)``. Their history
    stays with its week (``history.maintain``)."""
    rows = conn.execute(PURGE_EXPIRED, {**_cutoffs(before), "after": after, "limit": limit}).all()
    deleted = {s: int(n) for s, n, _ in rows}
    last = max((int(m) for _, _, m in rows), default=after)
    return deleted, last


def _cutoffs(before: dict[str, datetime]) -> dict[str, datetime]:
    return {f"{status}_before": at for status, at in before.items()}


def _ids(rows: Sequence[Any]) -> list[int]:
    return [int(r[0]) for r in rows]
