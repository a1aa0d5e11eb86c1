"""All SQL of campaigns: audience and code imports, the set-based fan-out, pause and resume.

Like ``notifier.store``, the only other module that talks to the driver. Every step is
idempotent, so a launch that died half-way is finished by running it again:

* a recipient is staged once (primary key ``(campaign_id, recipient)``), a code once (primary
  key ``(campaign_id, code)``);
* recipients and codes get dense positions per campaign as they are imported (unique per
  campaign), and recipient N is given code N: the pairing is fixed before the launch, which only
  reads it, so a code goes to one recipient and a recipient gets one code whatever is re-run;
* a recipient gets at most one notification (unique index on ``(campaign_id, recipient)``).

Imports into one campaign take turns (an advisory lock), so their positions never collide.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

import psycopg
from psycopg import sql
from sqlalchemy import Connection, text

from notifier import store
from notifier.settings import get_settings

CREATE = text(
    """
    INSERT INTO campaigns (name, channel, subject, body, payload, priority, max_attempts)
    VALUES (:name, :channel, :subject, :body, CAST(:payload AS jsonb), :priority, :max_attempts)
    RETURNING id
    """
)

BY_NAME = text(
    "SELECT id, name, channel, subject, body, payload, status, priority, max_attempts"
    " FROM campaigns WHERE name = :name"
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

LOCK_CAMPAIGN = text(
    "SELECT pg_advisory_xact_lock(hashtext('notifier.campaign'), CAST(:id AS int))"
)

# The new recipients among {source}'s rows (recipient, fields), each recipient once, numbered
# on from the campaign's last position. Sorted once; the primary key is then filled in order.
NEW_RECIPIENTS = """
    INSERT INTO campaign_recipients (campaign_id, position, recipient, fields)
    SELECT :id,
           (SELECT coalesce(max(position), 0) FROM campaign_recipients WHERE campaign_id = :id)
             + row_number() OVER (ORDER BY s.recipient),
           s.recipient, s.fields
      FROM (SELECT DISTINCT ON (recipient) recipient, fields
              FROM ({source}) AS source ORDER BY recipient) AS s
     WHERE NOT EXISTS (SELECT 1 FROM campaign_recipients AS r
                        WHERE r.campaign_id = :id AND r.recipient = s.recipient)
"""

# A CSV staged by ``import_audience``: c0 the recipient, c1... the fields ({fields} pairs them
# with their names).
STAGED = """
    SELECT trim(c0) AS recipient, {fields} AS fields
      FROM stage WHERE coalesce(trim(c0), '') <> ''
"""

#: The role an audience query runs as: it reads only what operators GRANT it (migration 0010).
AUDIENCE_ROLE = "notifier_audience"

# An operator's query with a ``recipient`` column, its other columns the fields, run by
# ``notifier_audience_rows`` (migration 0010) as notifier_audience, which no query can leave.
QUERIED = "COPY (SELECT recipient, fields FROM notifier_audience_rows({query})) TO STDOUT"

QUERIED_STAGE = "CREATE TEMP TABLE stage (recipient text, fields jsonb) ON COMMIT DROP"

STAGED_QUERY = "SELECT recipient, fields FROM stage"

CODES_FROM_STAGE = """
    INSERT INTO campaign_codes (campaign_id, position, code)
    SELECT %(campaign_id)s,
           (SELECT coalesce(max(position), 0) FROM campaign_codes
             WHERE campaign_id = %(campaign_id)s) + row_number() OVER (ORDER BY s.code),
           s.code
      FROM (SELECT DISTINCT trim(code) AS code FROM stage
             WHERE coalesce(trim(code), '') <> '') AS s
     WHERE NOT EXISTS (SELECT 1 FROM campaign_codes AS k
                        WHERE k.campaign_id = %(campaign_id)s AND k.code = s.code)
"""

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

BY_STATUS = text(
    """
    SELECT status, (status = 'pending' AND attempts > 0) AS retrying, count(*)
      FROM notifications WHERE campaign_id = :id GROUP BY 1, 2
    """
)

MISSING_FIELD = text(
    """
    SELECT recipient FROM campaign_recipients
     WHERE campaign_id = :id AND NOT (fields ?& CAST(:names AS text[]))
     LIMIT 1
    """
)

LAST_POSITION = text(
    "SELECT coalesce(max(position), 0), now() FROM campaign_recipients WHERE campaign_id = :id"
)

# {subject} and {body} are SQL expressions built by ``notifier.campaigns.render_sql`` from the
# campaign's templates; only bound parameters and fixed column names go into them.
FAN_OUT = """
    INSERT INTO notifications
           (channel, recipient, subject, body, payload, priority, max_attempts, campaign_id,
            next_attempt_at)
    SELECT :channel, r.recipient, {subject}, {body},
           CAST(:payload AS jsonb) || CASE WHEN k.code IS NULL THEN '{{}}'::jsonb
                                            ELSE jsonb_build_object('code', k.code) END,
           :priority, :max_attempts, :id, :due
      FROM campaign_recipients r
      LEFT JOIN campaign_codes k
             ON k.campaign_id = :id AND k.position = r.position
            AND k.position > :after AND k.position <= :upto
     WHERE r.campaign_id = :id AND r.position > :after AND r.position <= :upto
    {on_conflict}
"""

# Skipping the rows a chunk already has costs a fifth of its time (a speculative insertion per
# row), so only a chunk that has some pays for it. Launches of a campaign take turns (a session
# lock held by the launch), so what a launch finds before writing stays true while it writes.
ON_CONFLICT = "ON CONFLICT (campaign_id, recipient) WHERE campaign_id IS NOT NULL DO NOTHING"

LOCK_LAUNCH = text("SELECT pg_advisory_lock(hashtext('notifier.launch'), CAST(:id AS int))")
UNLOCK_LAUNCH = text("SELECT pg_advisory_unlock(hashtext('notifier.launch'), CAST(:id AS int))")

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

PARK = text(
    """
    UPDATE notifications SET next_attempt_at = 'infinity', updated_at = now()
     WHERE campaign_id = :id AND status = 'pending'
    """
)

UNPARK = text(
    """
    UPDATE notifications SET next_attempt_at = now(), updated_at = now()
     WHERE campaign_id = :id AND status = 'pending' AND next_attempt_at = 'infinity'
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


@dataclass(frozen=True, slots=True)
class Counts:
    recipients: int
    codes: int
    codes_given: int
    notifications: int
    by_status: dict[str, int]
    retrying: int


def create(conn: Connection, values: Mapping[str, Any]) -> int:
    return int(conn.execute(CREATE, dict(values)).scalar_one())


def by_name(conn: Connection, name: str) -> CampaignRow | None:
    row = conn.execute(BY_NAME, {"name": name}).first()
    return None if row is None else CampaignRow(*row)


def set_status(conn: Connection, campaign_id: int, status: str, allowed: Sequence[str]) -> bool:
    """Move to ``status`` if the campaign is in one of ``allowed``; whether it moved."""
    params = {"id": campaign_id, "status": status, "allowed": list(allowed)}
    return conn.execute(SET_STATUS, params).first() is not None


def import_audience(
    conn: Connection, campaign_id: int, rows: IO[str], recipient_column: str
) -> tuple[list[str], int]:
    """COPY a CSV audience in; its other columns become each recipient's fields.

    Returns the field names and how many new recipients were staged.
    """
    reader = csv.reader(rows)
    header = next(reader, None)
    if not header:
        raise ValueError("the audience CSV is empty; it needs a header row")
    header = [h.strip() for h in header]
    if recipient_column not in header:
        raise ValueError(
            f"the audience CSV has no {recipient_column!r} column (it has: {', '.join(header)})"
        )
    if len(set(header)) != len(header):
        raise ValueError("the audience CSV repeats a column name")
    order = [header.index(recipient_column)] + [
        i for i, h in enumerate(header) if h != recipient_column
    ]
    fields = [header[i] for i in order[1:]]
    conn.execute(LOCK_CAMPAIGN, {"id": campaign_id})
    raw = store.driver(conn)
    with raw.cursor() as cur:
        columns = ", ".join(f"c{i} text" for i in range(len(order)))
        cur.execute(f"CREATE TEMP TABLE stage ({columns}) ON COMMIT DROP")
        with cur.copy(
            f"COPY stage ({', '.join(f'c{i}' for i in range(len(order)))}) FROM STDIN"
        ) as copy:
            for record in reader:
                if len(record) != len(header):
                    raise ValueError(
                        f"audience CSV line {reader.line_num} has {len(record)} values;"
                        f" the header has {len(header)}"
                    )
                copy.write_row([record[i] for i in order])
    pairs = ", ".join(f"CAST(:f{i} AS text), c{i + 1}" for i in range(len(fields)))
    expression = f"jsonb_build_object({pairs})" if fields else "'{}'::jsonb"
    params: dict[str, Any] = {"id": campaign_id}
    params.update({f"f{i}": name for i, name in enumerate(fields)})
    source = STAGED.format(fields=expression)
    added = int(conn.execute(text(NEW_RECIPIENTS.format(source=source)), params).rowcount)
    conn.execute(text("DROP TABLE stage"))
    return fields, added


def audience_from_query(
    conn: Connection, campaign_id: int, query: str, timeout_seconds: float | None = None
) -> int:
    """Stage the rows of an operator's query; it must return a ``recipient`` column.

    The query runs on a connection of its own, closed afterwards, in a read-only transaction
    as ``notifier_audience`` with a ``statement_timeout`` (``NOTIFIER_AUDIENCE_QUERY_TIMEOUT``
    by default): it reads only the tables that role was granted, and nothing it sets or locks
    outlives it. Its rows are copied into ``conn``'s transaction, which alone writes.
    """
    timeout = get_settings().audience_query_timeout if timeout_seconds is None else timeout_seconds
    conn.execute(LOCK_CAMPAIGN, {"id": campaign_id})
    raw = store.driver(conn)
    raw.execute(QUERIED_STAGE)
    with conn.engine.connect() as reader:
        try:
            source = store.driver(reader)
            source.execute("SET TRANSACTION READ ONLY")
            source.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(AUDIENCE_ROLE)))
            milliseconds = str(int(timeout * 1000))
            source.execute("SELECT set_config('statement_timeout', %s, true)", [milliseconds])
            with (
                source.cursor().copy(sql.SQL(QUERIED).format(query=sql.Literal(query))) as rows,
                raw.cursor().copy("COPY stage (recipient, fields) FROM STDIN") as stage,
            ):
                for data in rows:
                    stage.write(data)
        except psycopg.Error as exc:
            raise ValueError(_refused(exc, timeout)) from None
        finally:
            reader.invalidate()  # closed, not pooled: whatever the query set or locked goes with it
    statement = text(NEW_RECIPIENTS.format(source=STAGED_QUERY))
    added = int(conn.execute(statement, {"id": campaign_id}).rowcount)
    conn.execute(text("DROP TABLE stage"))
    return added


def _refused(exc: psycopg.Error, timeout: float) -> str:
    """One line saying why an audience query failed, and what to do about it."""
    reason = (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return (
            f"the audience query was refused ({reason}): it runs as {AUDIENCE_ROLE}, so grant"
            f" {AUDIENCE_ROLE} SELECT on the tables your audience query reads"
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return (
            f"the audience query ran longer than {timeout:g}s and was stopped"
            " (NOTIFIER_AUDIENCE_QUERY_TIMEOUT)"
        )
    if isinstance(exc, psycopg.errors.UndefinedColumn) and "q.recipient" in reason:
        return "the audience query must return a column named recipient"
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction | psycopg.errors.FeatureNotSupported):
        return f"the audience query may only read ({reason}); give a single SELECT"
    return f"the audience query failed: {reason}"


def import_codes(conn: Connection, campaign_id: int, codes: Iterable[str]) -> int:
    """COPY codes in, one per item; codes already in the pool are skipped."""
    conn.execute(LOCK_CAMPAIGN, {"id": campaign_id})
    raw = store.driver(conn)
    with raw.cursor() as cur:
        cur.execute("CREATE TEMP TABLE stage (code text) ON COMMIT DROP")
        with cur.copy("COPY stage (code) FROM STDIN") as copy:
            for code in codes:
                copy.write_row((code,))
        cur.execute(CODES_FROM_STAGE.encode(), {"campaign_id": campaign_id})
        added = cur.rowcount
        cur.execute("DROP TABLE stage")
    return added


def pool_counts(conn: Connection, campaign_id: int) -> tuple[int, int, int]:
    """(recipients, codes, codes given)."""
    recipients, codes, given = conn.execute(POOL_COUNTS, {"id": campaign_id}).one()
    return int(recipients), int(codes), int(given)


def counts(conn: Connection, campaign_id: int) -> Counts:
    recipients, codes, given = pool_counts(conn, campaign_id)
    notifications = conn.execute(NOTIFICATIONS, {"id": campaign_id}).scalar_one()
    by_status: dict[str, int] = {}
    retrying = 0
    for status, is_retry, n in conn.execute(BY_STATUS, {"id": campaign_id}).all():
        by_status[status] = by_status.get(status, 0) + int(n)
        retrying += int(n) if is_retry else 0
    return Counts(recipients, codes, given, int(notifications), by_status, retrying)


def recipient_missing(conn: Connection, campaign_id: int, names: Sequence[str]) -> str | None:
    """A recipient whose fields lack one of ``names``, if any."""
    row = conn.execute(MISSING_FIELD, {"id": campaign_id, "names": list(names)}).first()
    return None if row is None else str(row[0])


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
    due: datetime,
    after: int,
    upto: int,
    fresh: bool,
) -> int:
    """Write the notifications of the recipients at positions ``(after, upto]``, due at
    ``due``; how many were new. ``rendered`` is (subject SQL, body SQL, their parameters) from
    ``campaigns.render_sql``.

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
        subject=subject_sql, body=body_sql, on_conflict=ON_CONFLICT if started else ""
    )
    values = {
        **params,
        "channel": campaign.channel,
        "payload": payload_json,
        "priority": campaign.priority,
        "max_attempts": campaign.max_attempts,
        "id": campaign.id,
        "after": after,
        "upto": upto,
        "due": due,
    }
    return int(conn.execute(text(sql), values).rowcount)


def lock_launch(conn: Connection, campaign_id: int) -> None:
    """Wait until no other launch of the campaign runs, then hold it off until
    ``unlock_launch`` or until ``conn`` closes (a launch that dies releases it)."""
    conn.execute(LOCK_LAUNCH, {"id": campaign_id})


def unlock_launch(conn: Connection, campaign_id: int) -> None:
    conn.execute(UNLOCK_LAUNCH, {"id": campaign_id})


def has_rows(conn: Connection, campaign_id: int) -> bool:
    return bool(conn.execute(HAS_ROWS, {"id": campaign_id}).scalar_one())


def park(conn: Connection, campaign_id: int) -> int:
    """Hold a paused campaign's pending rows back (due at infinity)."""
    return int(conn.execute(PARK, {"id": campaign_id}).rowcount)


def unpark(conn: Connection, campaign_id: int) -> int:
    return int(conn.execute(UNPARK, {"id": campaign_id}).rowcount)


def cancel_unsent(conn: Connection, campaign_id: int) -> int:
    return int(conn.execute(CANCEL_UNSENT, {"id": campaign_id}).rowcount)
