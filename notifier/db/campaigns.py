"""All SQL of campaigns but their imports and launches: create, status, counts, pause, resume,
cancel and finish.

Part of ``notifier.db``, the package that talks to the driver. Launch chunks and the status
changes that must see all of them (cancel, pause, resume) take turns on a lock per campaign
(``hold_writes``), so a cancel is final for every row a launch writes, before or after it.

A launch's statements (the fan-out, its chunks and its lock) are in ``notifier.db.launches``;
the imports of audiences and codes in ``notifier.db.audience``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

CREATE = text(
    """
    INSERT INTO campaigns
           (name, channel, subject, body, template, locale, payload, priority, max_attempts,
            category, audience)
    VALUES (:name, :channel, :subject, :body, :template, :locale, CAST(:payload AS jsonb),
            :priority, :max_attempts, :category, :audience)
    RETURNING id
    """
)

BY_NAME = text(
    "SELECT id, name, channel, subject, body, payload, status, priority, max_attempts,"
    " template, locale, category, audience FROM campaigns WHERE name = :name"
)

SET_STATUS = text(
    """
    UPDATE campaigns SET status = :status, updated_at = now(),
           launched_at = CASE WHEN :status = 'launching' THEN coalesce(launched_at, now())
                              ELSE launched_at END
     WHERE id = :id AND status = ANY(CAST(:allowed AS text[]))
    RETURNING id
    """
)

# Recipients, codes, and codes given: those at a recipient's position, each that recipient's.
# Recipient positions run 1..last without a gap, so the last position is the recipient count.
POOL_COUNTS = text(
    """
    WITH last AS (SELECT coalesce(max(position), 0) AS position
                    FROM campaign_recipients WHERE campaign_id = :id)
    SELECT (SELECT position FROM last),
           (SELECT count(*) FROM campaign_codes WHERE campaign_id = :id),
           (SELECT count(*) FROM campaign_codes
             WHERE campaign_id = :id AND position <= (SELECT position FROM last))
    """
)

NOTIFICATIONS = text("SELECT count(*) FROM notifications WHERE campaign_id = :id")

# ``held``: pending rows a pause holds back (due at infinity; ``PARK``, ``PARK_CLAIMED`` and a
# launch's chunks written while paused).
BY_STATUS = text(
    """
    SELECT status, (status = 'pending' AND attempts > 0) AS retrying,
           (status = 'pending' AND next_attempt_at = 'infinity') AS held, count(*)
      FROM notifications WHERE campaign_id = :id GROUP BY 1, 2, 3
    """
)

# Chunks take it shared for their transaction; cancel, pause and resume take it exclusive. A
# heavyweight lock queues fairly: once a cancel waits, no chunk starts ahead of it, where share
# locks on the campaign's row would let overlapping chunks hold a cancel off until the launch ends.
_WRITES_KEY = "hashtext('notifier.campaign.writes'), CAST(:id AS int)"
HOLD_WRITES_SHARED = text(f"SELECT pg_advisory_xact_lock_shared({_WRITES_KEY})")
HOLD_WRITES_EXCLUSIVE = text(f"SELECT pg_advisory_xact_lock({_WRITES_KEY})")

STATUS = text("SELECT status FROM campaigns WHERE id = :id")

# The rows it holds back, and those a worker holds: each is handed back before its send
# (``queue.PARK_CLAIMED``), unless the send had begun.
PARK = text(
    """
    WITH parked AS (
        UPDATE notifications SET next_attempt_at = 'infinity', updated_at = now()
         WHERE campaign_id = :id AND status = 'pending'
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM parked),
           (SELECT count(*) FROM notifications WHERE campaign_id = :id AND status = 'processing')
    """
)

UNPARK = text(
    """
    UPDATE notifications SET next_attempt_at = now(), updated_at = now()
     WHERE campaign_id = :id AND status = 'pending' AND next_attempt_at = 'infinity'
    """
)

# A running campaign's first step to ``finished``: hold it against a launch (the session lock
# ``launches.LOCK_LAUNCH`` takes; shared, and only if free) until the transaction ends. A launch
# under way keeps its campaign out; one that starts now waits for the commit.
FINISH_CANDIDATES = text(
    """
    SELECT id FROM campaigns
     WHERE status = 'running' AND (CAST(:id AS bigint) IS NULL OR id = CAST(:id AS bigint))
       AND pg_try_advisory_xact_lock_shared(hashtext('notifier.launch'), CAST(id AS int))
    """
)

# Then, in a statement of its own (its snapshot sees every row a launch that ended before the
# lock wrote): fully launched (the chunks, which never overlap, cover every audience position)
# and no row pending or processing. The last test reads the campaign's rows through
# notifications_campaign_recipient backwards: a campaign being sent goes out in position
# order, so its unsent rows are at that end and one probe usually settles it.
FINISH = text(
    """
    UPDATE campaigns AS c SET status = 'finished', updated_at = now()
     WHERE c.id = ANY(CAST(:ids AS bigint[])) AND c.status = 'running'
       AND (SELECT coalesce(sum(last_position - first_position + 1), 0)
              FROM campaign_chunks WHERE campaign_id = c.id)
           >= (SELECT coalesce(max(position), 0)
                 FROM campaign_recipients WHERE campaign_id = c.id)
       AND (SELECT 1 FROM notifications AS n
             WHERE n.campaign_id = c.id AND n.status IN ('pending', 'processing')
             ORDER BY n.campaign_id DESC, n.recipient DESC LIMIT 1) IS NULL
    RETURNING c.name
    """
)

CANCEL_UNSENT = text(
    """
    UPDATE notifications
       SET status = 'cancelled', last_error = 'campaign cancelled', updated_at = now(),
           locked_until = NULL
     WHERE campaign_id = :id AND status IN ('pending', 'processing')
    """
)


@dataclass(frozen=True, slots=True)
class CampaignRow:
    id: int
    name: str
    channel: str
    subject: str | None
    body: str | None
    payload: dict[str, Any]
    status: str
    priority: int
    max_attempts: int
    #: a stored template each row names instead of a subject and body, and its locale
    template: str | None = None
    locale: str | None = None
    #: every row's category: what its opt-outs are of
    category: str = "marketing"
    #: ``addresses``: the audience is recipients; ``profiles``: it is profiles' ids
    audience: str = "addresses"


@dataclass(frozen=True, slots=True)
class Counts:
    recipients: int
    codes: int
    codes_given: int
    notifications: int
    by_status: dict[str, int]
    retrying: int
    #: pending rows held back by a pause (what ``pause`` counts, with the rows handed back since)
    held: int = 0


def create(conn: Connection, values: Mapping[str, Any]) -> int:
    return int(conn.execute(CREATE, dict(values)).scalar_one())


def by_name(conn: Connection, name: str) -> CampaignRow | None:
    row = conn.execute(BY_NAME, {"name": name}).first()
    return None if row is None else CampaignRow(*row)


def set_status(conn: Connection, campaign_id: int, status: str, allowed: Sequence[str]) -> bool:
    """Move to ``status`` if the campaign is in one of ``allowed``; whether it moved."""
    params = {"id": campaign_id, "status": status, "allowed": list(allowed)}
    return conn.execute(SET_STATUS, params).first() is not None


def pool_counts(conn: Connection, campaign_id: int) -> tuple[int, int, int]:
    """(recipients, codes, codes given)."""
    recipients, codes, given = conn.execute(POOL_COUNTS, {"id": campaign_id}).one()
    return int(recipients), int(codes), int(given)


def counts(conn: Connection, campaign_id: int) -> Counts:
    recipients, codes, given = pool_counts(conn, campaign_id)
    notifications = conn.execute(NOTIFICATIONS, {"id": campaign_id}).scalar_one()
    by_status: dict[str, int] = {}
    retrying = held = 0
    for status, is_retry, is_held, n in conn.execute(BY_STATUS, {"id": campaign_id}).all():
        by_status[status] = by_status.get(status, 0) + int(n)
        retrying += int(n) if is_retry else 0
        held += int(n) if is_held else 0
    return Counts(recipients, codes, given, int(notifications), by_status, retrying, held)


def hold_writes(conn: Connection, campaign_id: int, *, exclusive: bool) -> str:
    """Take the campaign's write lock until the transaction ends, and read its status then.

    Shared: a launch chunk, which must not start once a cancel waits, and must see it once it
    has committed. Exclusive: a status change that waits for the chunks under way.
    """
    conn.execute(HOLD_WRITES_EXCLUSIVE if exclusive else HOLD_WRITES_SHARED, {"id": campaign_id})
    return str(conn.execute(STATUS, {"id": campaign_id}).scalar_one())


def park(conn: Connection, campaign_id: int) -> tuple[int, int]:
    """Hold a paused campaign's pending rows back (due at infinity): how many, and how many
    rows workers hold (``processing``) at that moment."""
    held, claimed = conn.execute(PARK, {"id": campaign_id}).one()
    return int(held), int(claimed)


def unpark(conn: Connection, campaign_id: int) -> int:
    return int(conn.execute(UNPARK, {"id": campaign_id}).rowcount)


def cancel_unsent(conn: Connection, campaign_id: int) -> int:
    return int(conn.execute(CANCEL_UNSENT, {"id": campaign_id}).rowcount)


def finish(conn: Connection, campaign_id: int | None = None) -> list[str]:
    """Mark ``finished`` each running campaign (or just ``campaign_id``) that is fully launched
    and has no row pending or processing; the names of those it marked. Takes two statements,
    so run it in a transaction of its own."""
    ids = list(conn.execute(FINISH_CANDIDATES, {"id": campaign_id}).scalars())
    if not ids:
        return []
    return [str(name) for name in conn.execute(FINISH, {"ids": ids}).scalars()]
