"""All SQL of content: templates and the suppression list.

``notifier.delivery.prepare`` sees none of it. The dispatcher's two lookups take a whole batch
at once (its keys probed in the primary keys), so a batch costs one statement for each, never
one per row.

Suppression entries are stored and looked up by one rule, the database function
``suppression_recipient(channel, recipient)`` (migration 0009): an email address trimmed and in
lower case, any other recipient as written. A trigger applies it to every entry written,
producers' own INSERTs included, and every lookup here applies it to the address it looks for.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

# The batch's recipients travel as one JSON object, {channel: [recipient, ...]}: psycopg adapts
# a text[] an element at a time in Python (milliseconds for a batch of 500), json.dumps in C.
# A channel with no entry at all costs one index probe (min() reads the primary key's first
# entry), not one per recipient: a batch of such rows is all but free. Otherwise one primary-key
# probe per recipient; the LIMIT keeps the planner from flattening the last subquery into a join
# it might hash, whatever it guesses about the JSON's size.
SUPPRESSED = text(
    """
    SELECT c.key, r.recipient, s.reason
      FROM jsonb_each(CAST(:recipients AS jsonb)) AS c
     CROSS JOIN LATERAL (SELECT e AS recipient FROM jsonb_array_elements_text(c.value) AS e
                          WHERE (SELECT min(recipient) FROM suppressions
                                  WHERE channel = c.key) IS NOT NULL) AS r
     CROSS JOIN LATERAL (SELECT reason FROM suppressions
                          WHERE channel = c.key
                            AND recipient = suppression_recipient(c.key, r.recipient)
                          LIMIT 1) AS s
    """
)

SUPPRESS_MANY = text(
    """
    INSERT INTO suppressions (channel, recipient, reason)
    SELECT * FROM unnest(CAST(:channels AS text[]), CAST(:recipients AS text[]),
                         CAST(:reasons AS text[]))
    ON CONFLICT (channel, recipient) DO NOTHING
    """
)

TEMPLATES_OF = text(
    """
    SELECT t.name, t.channel, t.locale, t.subject, t.body, t.html, t.updated_at
      FROM templates t
      JOIN unnest(CAST(:names AS text[]), CAST(:channels AS text[])) AS v(name, channel)
           ON t.name = v.name AND t.channel = v.channel
    """
)

# xmax is 0 for a row this statement inserted, and set for one it updated.
UPSERT_TEMPLATE = text(
    """
    INSERT INTO templates (name, channel, locale, subject, body, html)
    VALUES (:name, :channel, :locale, :subject, :body, :html)
    ON CONFLICT (name, channel, locale) DO UPDATE
       SET subject = excluded.subject, body = excluded.body, html = excluded.html,
           updated_at = now()
    RETURNING xmax = 0
    """
)

LIST_TEMPLATES = text(
    "SELECT name, channel, locale, subject, body, html, updated_at FROM templates"
    " WHERE (CAST(:name AS text) IS NULL OR name = :name)"
    "   AND (CAST(:channel AS text) IS NULL OR channel = :channel)"
    "   AND (CAST(:locale AS text) IS NULL OR locale = :locale)"
    " ORDER BY name, channel, locale"
)

DELETE_TEMPLATE = text(
    "DELETE FROM templates WHERE name = :name AND channel = :channel AND locale = :locale"
)

# The entry as stored, new or not (the no-op update keeps the first reason and time); xmax is
# 0 for a row this statement inserted.
SUPPRESS_ONE = text(
    """
    INSERT INTO suppressions (channel, recipient, reason) VALUES (:channel, :recipient, :reason)
    ON CONFLICT (channel, recipient) DO UPDATE SET reason = suppressions.reason
    RETURNING channel, recipient, reason, created_at, xmax = 0
    """
)

UNSUPPRESS = text(
    "DELETE FROM suppressions"
    " WHERE channel = :channel AND recipient = suppression_recipient(:channel, :recipient)"
)

LIST_SUPPRESSIONS = text(
    "SELECT channel, recipient, reason, created_at FROM suppressions"
    " WHERE CAST(:channel AS text) IS NULL OR channel = :channel"
    " ORDER BY created_at DESC, channel, recipient LIMIT :limit"
)


@dataclass(frozen=True, slots=True)
class TemplateRow:
    name: str
    channel: str
    locale: str
    subject: str | None
    body: str | None
    html: str | None
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Suppression:
    channel: str
    recipient: str
    reason: str
    created_at: datetime


# --- what the dispatcher uses, a batch at a time -------------------------------------------------


def suppressed(conn: Connection, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Of these (channel, recipient) pairs, the suppressed ones, with their reasons."""
    by_channel: dict[str, dict[str, None]] = {}
    for channel, recipient in pairs:
        by_channel.setdefault(channel, {})[recipient] = None
    if not by_channel:
        return {}
    recipients = json.dumps({channel: list(rs) for channel, rs in by_channel.items()})
    rows = conn.execute(SUPPRESSED, {"recipients": recipients}).all()
    return {(channel, recipient): reason for channel, recipient, reason in rows}


def suppress_many(conn: Connection, entries: Iterable[tuple[str, str, str]]) -> int:
    """Add (channel, recipient, reason) entries; those already there keep their first reason.

    Returns how many were new.
    """
    channels, recipients, reasons = _columns(entries, 3)
    if not channels:
        return 0
    params = {"channels": channels, "recipients": recipients, "reasons": reasons}
    return int(conn.execute(SUPPRESS_MANY, params).rowcount)


def templates_of(conn: Connection, keys: Iterable[tuple[str, str]]) -> list[TemplateRow]:
    """Every locale of the templates with these (name, channel) keys."""
    names, channels = _columns(keys, 2)
    if not names:
        return []
    rows = conn.execute(TEMPLATES_OF, {"names": names, "channels": channels}).all()
    return [TemplateRow(*row) for row in rows]


# --- what operators use --------------------------------------------------------------------------


def upsert_template(
    conn: Connection,
    name: str,
    channel: str,
    locale: str,
    parts: tuple[str | None, str | None, str | None],
) -> bool:
    """Write a template's (subject, body, html), replacing the version there was; whether new."""
    subject, body, html = parts
    params = {
        "name": name,
        "channel": channel,
        "locale": locale,
        "subject": subject,
        "body": body,
        "html": html,
    }
    return bool(conn.execute(UPSERT_TEMPLATE, params).scalar_one())


def list_templates(
    conn: Connection,
    name: str | None = None,
    channel: str | None = None,
    locale: str | None = None,
) -> list[TemplateRow]:
    params = {"name": name, "channel": channel, "locale": locale}
    return [TemplateRow(*row) for row in conn.execute(LIST_TEMPLATES, params).all()]


def delete_template(conn: Connection, name: str, channel: str, locale: str) -> bool:
    params = {"name": name, "channel": channel, "locale": locale}
    return int(conn.execute(DELETE_TEMPLATE, params).rowcount) > 0


def suppress(
    conn: Connection, channel: str, recipient: str, reason: str
) -> tuple[Suppression, bool]:
    """Add one entry: the entry as stored (an address as it is compared), and whether it is
    new; an entry that was there already keeps its reason and time."""
    params = {"channel": channel, "recipient": recipient, "reason": reason}
    *entry, new = conn.execute(SUPPRESS_ONE, params).one()
    return Suppression(*entry), bool(new)


def unsuppress(conn: Connection, channel: str, recipient: str) -> bool:
    params = {"channel": channel, "recipient": recipient}
    return int(conn.execute(UNSUPPRESS, params).rowcount) > 0


def list_suppressions(conn: Connection, channel: str | None, limit: int) -> list[Suppression]:
    """The newest ``limit`` entries, of one channel or all."""
    params = {"channel": channel, "limit": limit}
    return [Suppression(*row) for row in conn.execute(LIST_SUPPRESSIONS, params).all()]


def _columns(rows: Iterable[tuple[str, ...]], width: int) -> list[list[str]]:
    """Distinct tuples turned into ``width`` parallel arrays, as ``unnest`` takes them."""
    columns: list[list[str]] = [[] for _ in range(width)]
    for row in dict.fromkeys(rows):
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return columns
