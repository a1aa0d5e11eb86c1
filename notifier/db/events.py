"""All SQL of delivery feedback, named by intent; nothing else in ``notifier.events`` has any.

Applying a report takes the row's lock first (``lock_by_id`` / ``lock_by_message_id``), so two
copies of one report arriving at once are applied one after the other, and the second finds
the first's attempt (``append_attempt`` writes nothing) and state (``advance`` changes nothing).

A report applies to its own row only: the lock reads whether the recipient the report names is
the row's, by the suppression list's rule (``suppression_recipient``), so a report about one
message cannot be made to speak for another address.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from notifier.db import suppressions

_ROW = (
    "SELECT id, channel, recipient, attempts, category,"
    " CAST(:named AS text) IS NULL OR suppression_recipient(channel, recipient)"
    "   = suppression_recipient(channel, CAST(:named AS text))"
    " FROM notifications"
)

LOCK_BY_ID = text(f"{_ROW} WHERE id = :id AND channel = :channel FOR UPDATE")

# Twilio names the message by its SID, which the send stored (indexed, migration 0014).
LOCK_BY_MESSAGE_ID = text(
    f"{_ROW} WHERE provider_message_id = :message_id AND channel = :channel"
    " ORDER BY id LIMIT 1 FOR UPDATE"
)

# One attempt per (row, outcome, provider): a report delivered twice is recorded once.
APPEND_ATTEMPT = text(
    """
    INSERT INTO notification_attempts
           (notification_id, attempt, at, worker, channel, outcome, error, provider)
    SELECT :id, :attempt, :at, 'events', :channel, :outcome, :error, :provider
     WHERE NOT EXISTS (SELECT 1 FROM notification_attempts
                        WHERE notification_id = :id AND outcome = :outcome
                          AND provider = :provider)
    """
)

_RANK = (
    "CASE {0} WHEN 'delivered' THEN 1 WHEN 'undelivered' THEN 2 WHEN 'bounced' THEN 2"
    " WHEN 'complained' THEN 3 END"
)

# A state moves forward only: to a higher rank (notifier.events.model.RANK), or to the same
# rank with a later time. An older or lesser report changes nothing.
ADVANCE = text(
    f"""
    UPDATE notifications
       SET delivery_status = :status, delivery_at = :at, delivery_detail = :detail
     WHERE id = :id
       AND (delivery_status IS NULL
            OR {_RANK.format("CAST(:status AS text)")} > {_RANK.format("delivery_status")}
            OR ({_RANK.format("CAST(:status AS text)")} = {_RANK.format("delivery_status")}
                AND :at > delivery_at))
    """
)

# Through the table's trigger, which stores the address as suppression_recipient() has it; an
# entry already there keeps its first reason.
OPT_OUT = text(
    "INSERT INTO category_opt_outs (channel, recipient, category, reason)"
    " VALUES (:channel, :recipient, :category, :reason)"
    " ON CONFLICT (channel, recipient, category) DO NOTHING"
)

DELIVERY_OF = text(
    "SELECT delivery_status, delivery_at, delivery_detail FROM notifications WHERE id = :id"
)


@dataclass(frozen=True, slots=True)
class Row:
    id: int
    channel: str
    recipient: str
    attempts: int
    category: str | None
    #: whether the report names this row's recipient (or none at all)
    named_matches: bool


def lock_row(
    conn: Connection,
    channel: str,
    notification_id: int | None,
    message_id: str | None,
    named: str | None = None,
) -> Row | None:
    """The row a report is about, locked until the transaction ends; ``None`` if none is.
    ``named`` is the recipient the report names, compared with the row's."""
    if notification_id is not None:
        params = {"id": notification_id, "channel": channel, "named": named}
        found = conn.execute(LOCK_BY_ID, params).first()
        if found is not None:
            return Row(*found)
    if message_id:
        params = {"message_id": message_id, "channel": channel, "named": named}
        found = conn.execute(LOCK_BY_MESSAGE_ID, params).first()
        if found is not None:
            return Row(*found)
    return None


def append_attempt(
    conn: Connection, row: Row, *, at: datetime, outcome: str, error: str, provider: str
) -> bool:
    """Record the report in the row's history, unless the same outcome already is; whether new."""
    params = {
        "id": row.id,
        "attempt": row.attempts,
        "at": at,
        "channel": row.channel,
        "outcome": outcome,
        "error": error or None,
        "provider": provider,
    }
    return int(conn.execute(APPEND_ATTEMPT, params).rowcount) > 0


def advance(conn: Connection, row_id: int, status: str, at: datetime, detail: str) -> bool:
    """Move the row's delivery state forward to ``status``; whether it moved."""
    params = {"id": row_id, "status": status, "at": at, "detail": detail or None}
    return int(conn.execute(ADVANCE, params).rowcount) > 0


def suppress(conn: Connection, channel: str, recipient: str, reason: str, kind: str) -> bool:
    """Add a suppression entry of ``kind`` (every category); whether it is new. The list's one
    statement for adding entries (``suppressions.suppress_many``): one already there keeps its
    first reason and kind."""
    return suppressions.suppress_many(conn, [(channel, recipient, reason, kind)]) > 0


def opt_out(conn: Connection, channel: str, recipient: str, category: str, reason: str) -> bool:
    """Opt the recipient out of one category; whether that is new."""
    params = {"channel": channel, "recipient": recipient, "category": category, "reason": reason}
    return int(conn.execute(OPT_OUT, params).rowcount) > 0


def delivery_of(conn: Connection, row_id: int) -> tuple[str | None, datetime | None, str | None]:
    """A row's delivery state, time and detail."""
    status, at, detail = conn.execute(DELIVERY_OF, {"id": row_id}).one()
    return status, at, detail
