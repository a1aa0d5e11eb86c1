"""All SQL of a campaign's launch: the set-based fan-out, the chunks it records, its lock.

Part of ``notifier.db``, the package that talks to the driver. Every step is idempotent, so a
launch that died half-way is finished by running it again:

* a recipient is staged once (primary key ``(campaign_id, recipient)``), a code once (primary
  key ``(campaign_id, code)``);
* recipients and codes get dense positions per campaign as they are imported (unique per
  campaign), and recipient N is given code N: the pairing is fixed before the launch, which only
  reads it, so a code goes to one recipient and a recipient gets one code whatever is re-run;
* a recipient gets at most one notification (unique index on ``(campaign_id, recipient)``);
* every chunk a launch writes is recorded in ``campaign_chunks`` in its own transaction, and a
  launch writes only the positions no chunk has: the record outlives ``notifier purge``, so a
  finished campaign whose rows were purged is never written, and sent, again.

Each chunk holds the campaign's write lock (``notifier.db.campaigns.hold_writes``) while it
writes, so a cancel is final for every row a launch writes, before or after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from notifier.db.campaigns import CampaignRow

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
           (channel, recipient, profile, subject, body, payload, priority, max_attempts,
            campaign_id, next_attempt_at, template, locale, category)
    SELECT :channel, {addressee}, {subject}, {body},
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
# A person's template renders ``recipient`` from the address it is sent to, and their fields.
PROFILE_TEMPLATED_PAYLOAD = (
    "CAST(:payload AS jsonb) || r.fields || jsonb_build_object('campaign', CAST(:name AS text))"
)

# Skipping the rows a chunk already has costs a fifth of its time (a speculative insertion per
# row), so only a chunk that has some pays for it. Launches of a campaign take turns (a session
# lock held by the launch), so what a launch finds before writing stays true while it writes.
ON_CONFLICT = (
    "ON CONFLICT (campaign_id, recipient) WHERE campaign_id IS NOT NULL AND profile IS NULL"
    " DO NOTHING"
)
# A campaign to profiles: each audience entry is a profile's id; the address is the person's
# when the row is sent (``notifier.db.profiles``).
TO_ADDRESS = "r.recipient, NULL"
TO_PROFILE = "'', r.recipient"
PROFILE_ON_CONFLICT = (
    "ON CONFLICT (campaign_id, profile) WHERE campaign_id IS NOT NULL AND profile IS NOT NULL"
    " DO NOTHING"
)

LOCK_LAUNCH = text("SELECT pg_advisory_lock(hashtext('notifier.launch'), CAST(:id AS int))")
UNLOCK_LAUNCH = text("SELECT pg_advisory_unlock(hashtext('notifier.launch'), CAST(:id AS int))")

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

# Whether a chunk already has rows: one probe per recipient of the partial unique index its
# audience writes through (the predicate is spelled out so the planner can use that index).
CHUNK_STARTED = """
    SELECT EXISTS (SELECT 1 FROM campaign_recipients r
                    CROSS JOIN LATERAL (SELECT 1 FROM notifications n
                                         WHERE n.campaign_id = :id AND {probe}
                                         LIMIT 1) AS written
                    WHERE r.campaign_id = :id AND r.position > :after AND r.position <= :upto)
"""
ADDRESS_WRITTEN = text(
    CHUNK_STARTED.format(probe="n.recipient = r.recipient AND n.profile IS NULL")
)
PROFILE_WRITTEN = text(
    CHUNK_STARTED.format(probe="n.profile = r.recipient AND n.profile IS NOT NULL")
)


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
    people = campaign.audience == "profiles"
    probe = PROFILE_WRITTEN if people else ADDRESS_WRITTEN
    started = not fresh and bool(conn.execute(probe, chunk).scalar_one())
    templated = PROFILE_TEMPLATED_PAYLOAD if people else TEMPLATED_PAYLOAD
    conflict = PROFILE_ON_CONFLICT if people else ON_CONFLICT
    sql = FAN_OUT.format(
        addressee=TO_PROFILE if people else TO_ADDRESS,
        subject=subject_sql,
        body=body_sql,
        payload=PAYLOAD if campaign.template is None else templated,
        on_conflict=conflict if started else "",
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
