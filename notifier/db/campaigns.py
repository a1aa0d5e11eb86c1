"""All SQL of campaigns but their imports: the set-based fan-out, cancel, pause and resume.

Part of ``notifier.db``, the package that talks to the driver. Every step is
idempotent, so a launch that died half-way is finished by running it again:

* a recipient is staged once (primary key ``(campaign_id, recipient)``), a code once (primary
  key ``(campaign_id, code)``);
* recipients and codes get dense positions per campaign as they are imported (unique per
  campaign), and recipient N is given code N: the pairing is fixed before the launch, which only
  reads it, so a code goes to one recipient and a recipient gets one code whatever is re-run;
* a recipient gets at most one notification (unique index on ``(campaign_id, recipient)``);
* every chunk a launch writes is recorded in ``campaign_chunks`` in its own transaction, and a
  launch writes only the positions no chunk has: the record outlives ``notifier purge``, so a
  finished campaign whose rows were purged is never written, and sent, again.

Launch chunks and the status changes that must see all of them (cancel, pause, resume) take
turns on a lock per campaign (``hold_writes``), so a cancel is final for every row a launch
writes, before or after it.

The imports of audiences and codes are in ``notifier.db.audience``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

CREATE = text(
    """
    INSERT INTO campaigns
           (name, channel, subject, body, template, locale, payload, priority, max_attempts,
            category)
    VALUES (:name, :channel, :subject, :body, :template, :locale, CAST(:payload AS jsonb),
            :priority, :max_attempts, :category)
    RETURNING id
    """
)

BY_NAME = text(
    "SELECT id, name, channel, subject, body, payload, status, priority, max_attempts,"
    " template, locale, category FROM campaigns WHERE name = :name"
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

MISSING_FIELD = text(
    """
    SELECT recipient, ARRAY(SELECT name FROM unnest(CAST(:names AS text[])) AS name
                             WHERE NOT fields ? name)
      FROM campaign_recipients
     WHERE campaign_id = :id AND NOT (fields ?& CAST(:names AS text[]))
     LIMIT 1
    """
)

LAST_POSITION = text(
    "SELECT coalesce(max(position), 0), now() FROM campaign_recipients WHERE campaign_id = :id"
)

# {subject} and {body} are SQL expressions built by ``notifier.campaigns.messages.render_sql``
# from the campaign's templates; only bound parameters and fixed column names go into them.
# {payload} is one of the two below.
FAN_OUT = """
    INSERT INTO notifications
           (channel, recipient, subject, body, payload, priority, max_attempts, campaign_id,
            next_attempt_at, template, locale, category)
    SELECT :channel, r.recipient, {subject}, {body},
           {payload} || CASE WHEN k.code IS NULL THEN '{{}}'::jsonb
                             ELSE jsonb_build_object('code', k.code) END,
           :priority, :max_attempts, :id,
           CASE WHEN :parked THEN 'infinity'::timestamptz ELSE CAST(:due AS timestamptz) END,
           CAST(:template AS text), CAST(:locale AS text), CAST(:category AS text)
      FROM campaign_recipients r
      LEFT JOIN campaign_codes k
             ON k.campaign_id = :id AND k.position = r.position
            AND k.position > :after AND k.position <= :upto
     WHERE r.campaign_id = :id AND r.position > :after AND r.position <= :upto
    {on_conflict}
"""

# A campaign filled in by the fan-out carries its payload (with ``campaign``) and the code. A
# campaign that names a stored template gives the worker what that template renders from: the
# recipient's fields, ``campaign`` and ``recipient`` (over fields of those names), and the code.
PAYLOAD = "CAST(:payload AS jsonb)"
TEMPLATED_PAYLOAD = (
    "CAST(:payload AS jsonb) || r.fields"
    " || jsonb_build_object('campaign', CAST(:name AS text), 'recipient', r.recipient)"
)

# Skipping the rows a chunk already has costs a fifth of its time (a speculative insertion per
# row), so only a chunk that has some pays for it. Launches of a campaign take turns (a session
# lock held by the launch), so what a launch finds before writing stays true while it writes.
ON_CONFLICT = "ON CONFLICT (campaign_id, recipient) WHERE campaign_id IS NOT NULL DO NOTHING"

LOCK_LAUNCH = text("SELECT pg_advisory_lock(hashtext('notifier.launch'), CAST(:id AS int))")
UNLOCK_LAUNCH = text("SELECT pg_advisory_unlock(hashtext('notifier.launch'), CAST(:id AS int))")

# Chunks take it shared for their transaction; cancel, pause and resume take it exclusive. A
# heavyweight lock queues fairly: once a cancel waits, no chunk starts ahead of it, where share
# locks on the campaign's row would let overlapping chunks hold a cancel off until the launch ends.
_WRITES_KEY = "hashtext('notifier.campaign.writes'), CAST(:id AS int)"
HOLD_WRITES_SHARED = text(f"SELECT pg_advisory_xact_lock_shared({_WRITES_KEY})")
HOLD_WRITES_EXCLUSIVE = text(f"SELECT pg_advisory_xact_lock({_WRITES_KEY})")

STATUS = text("SELECT status FROM campaigns WHERE id = :id")

WRITTEN_RANGES = text(
    "SELECT first_position, last_position FROM campaign_chunks"
    " WHERE campaign_id = :id ORDER BY first_position"
)

RECORD_CHUNK = text(
    """
    INSERT INTO campaign_chunks (campaign_id, first_position, last_position, written)
    VALUES (:id, :after + 1, :upto, :written)
    """
)

HAS_ROWS = text("SELECT EXISTS (SELECT 1 FROM notifications WHERE campaign_id = :id)")

CHUNK_STARTED = text(
    """
    SELECT EXISTS (SELECT 1 FROM campaign_recipients r
                    CROSS JOIN LATERAL (SELECT 1 FROM notifications n
                                         WHERE n.campaign_id = :id AND n.recipient = r.recipient
                                         LIMIT 1) AS written  -- one index probe per recipient
                    WHERE r.campaign_id = :id AND r.position > :after AND r.position <= :upto)
    """
)

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
# ``LOCK_LAUNCH`` takes; shared, and only if free) until the transaction ends. A launch under way
# keeps its campaign out; one that starts now waits for the commit.
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


def recipient_missing(
    conn: Connection, campaign_id: int, names: Sequence[str]
) -> tuple[str, list[str]] | None:
    """A recipient whose fields lack some of ``names``, and which, if there is one."""
    row = conn.execute(MISSING_FIELD, {"id": campaign_id, "names": list(names)}).first()
    return None if row is None else (str(row[0]), [str(name) for name in row[1]])


def last_position(conn: Connection, campaign_id: int) -> tuple[int, datetime]:
    """The position of the campaign's last recipient (0 with none), and the database's time."""
    last, now = conn.execute(LAST_POSITION, {"id": campaign_id}).one()
    return int(last), now


def analyze(conn: Connection) -> None:
    """Refresh the planner's statistics after a bulk import: without them it picks nested
    loops over a million staged rows."""
    conn.execute(text("ANALYZE campaign_recipients, campaign_codes"))


def fan_out(
    conn: Connection,
    campaign: CampaignRow,
    rendered: tuple[str, str, Mapping[str, Any]],
    payload_json: str,
    due: datetime | None,
    after: int,
    upto: int,
    fresh: bool,
) -> int:
    """Write the notifications of the recipients at positions ``(after, upto]``, due at
    ``due`` (``None``: parked, for a paused campaign); how many were new. ``rendered`` is
    (subject SQL, body SQL, their parameters) from ``campaigns.messages.render_sql``. The
    caller holds ``hold_writes`` and records the chunk with ``record_chunk`` in the same
    transaction.

    Every chunk of a launch gets the same ``due``: rows then enter the due index in id order,
    at its end, whichever chunks run side by side.

    ``fresh``: the campaign had no notification when this launch (holding ``lock_launch``)
    began. Then, and for a chunk none of whose rows exist yet, rows are written without
    looking for each first; the unique index on ``(campaign_id, recipient)`` still has the
    last word.
    """
    subject_sql, body_sql, params = rendered
    chunk = {"id": campaign.id, "after": after, "upto": upto}
    started = not fresh and bool(conn.execute(CHUNK_STARTED, chunk).scalar_one())
    sql = FAN_OUT.format(
        subject=subject_sql,
        body=body_sql,
        payload=PAYLOAD if campaign.template is None else TEMPLATED_PAYLOAD,
        on_conflict=ON_CONFLICT if started else "",
    )
    values = {
        **params,
        "name": campaign.name,
        "template": campaign.template,
        "locale": campaign.locale,
        "category": campaign.category,
        "channel": campaign.channel,
        "payload": payload_json,
        "priority": campaign.priority,
        "max_attempts": campaign.max_attempts,
        "id": campaign.id,
        "after": after,
        "upto": upto,
        "due": due,
        "parked": due is None,
    }
    return int(conn.execute(text(sql), values).rowcount)


def lock_launch(conn: Connection, campaign_id: int) -> None:
    """Wait until no other launch of the campaign runs, then hold it off until
    ``unlock_launch`` or until ``conn`` closes (a launch that dies releases it)."""
    conn.execute(LOCK_LAUNCH, {"id": campaign_id})


def unlock_launch(conn: Connection, campaign_id: int) -> None:
    conn.execute(UNLOCK_LAUNCH, {"id": campaign_id})


def hold_writes(conn: Connection, campaign_id: int, *, exclusive: bool) -> str:
    """Take the campaign's write lock until the transaction ends, and read its status then.

    Shared: a launch chunk, which must not start once a cancel waits, and must see it once it
    has committed. Exclusive: a status change that waits for the chunks under way.
    """
    conn.execute(HOLD_WRITES_EXCLUSIVE if exclusive else HOLD_WRITES_SHARED, {"id": campaign_id})
    return str(conn.execute(STATUS, {"id": campaign_id}).scalar_one())


def written_ranges(conn: Connection, campaign_id: int) -> list[tuple[int, int]]:
    """The (first, last) positions of every chunk launches of the campaign have written."""
    rows = conn.execute(WRITTEN_RANGES, {"id": campaign_id}).all()
    return [(int(first), int(last)) for first, last in rows]


def record_chunk(conn: Connection, campaign_id: int, after: int, upto: int, written: int) -> None:
    """Remember that positions ``(after, upto]`` were written (``written`` of them new)."""
    params = {"id": campaign_id, "after": after, "upto": upto, "written": written}
    conn.execute(RECORD_CHUNK, params)


def has_rows(conn: Connection, campaign_id: int) -> bool:
    return bool(conn.execute(HAS_ROWS, {"id": campaign_id}).scalar_one())


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
