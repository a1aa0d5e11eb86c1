"""All SQL of content: templates and the suppression list.

``notifier.delivery.prepare`` sees none of it. The dispatcher's two lookups take a whole batch
at once (its keys probed in the primary keys), so a batch costs one statement for each, never
one per row.

Suppression entries are stored and looked up by one rule, the database function
``suppression_recipient(channel, recipient)`` (migration 0009): an email address trimmed and in
lower case, any other recipient as written. A trigger applies it to every entry written,
producers' own INSERTs included, and every lookup here applies it to the address it looks for.

What an entry covers (migration 0021): an entry of ``suppressions`` every row of its channel and
recipient, but a ``complaint`` only rows with a category (a complaint about a newsletter does
not stop a password reset); an entry of ``category_opt_outs`` the rows of its category.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

# The batch's rows travel as one JSON object, {channel: [[recipient, category], ...]}: psycopg
# adapts a text[] an element at a time in Python (milliseconds for a batch of 500), json.dumps
# in C. A channel with no entry in either table costs two index probes (min() reads a primary
# key's first entry), not one per row: a batch of such rows is all but free. Otherwise one
# primary-key probe per row in suppressions and, if that finds nothing, one in
# category_opt_outs; the LIMIT keeps the planner from flattening the last subquery into a join
# it might hash, whatever it guesses about the JSON's size, and stops at the first probe that
# finds an entry.
SUPPRESSED = text(
    """
    SELECT c.key, r.recipient, r.category, s.reason
      FROM jsonb_each(CAST(:rows AS jsonb)) AS c
     CROSS JOIN LATERAL (SELECT e ->> 0 AS recipient, e ->> 1 AS category
                           FROM jsonb_array_elements(c.value) AS e
                          WHERE (SELECT min(recipient) FROM suppressions
                                  WHERE channel = c.key) IS NOT NULL
                             OR (SELECT min(recipient) FROM category_opt_outs
                                  WHERE channel = c.key) IS NOT NULL) AS r
     CROSS JOIN LATERAL ((SELECT reason FROM suppressions
                           WHERE channel = c.key
                             AND recipient = suppression_recipient(c.key, r.recipient)
                             AND (kind <> 'complaint' OR r.category IS NOT NULL))
                         UNION ALL
                         (SELECT reason FROM category_opt_outs
                           WHERE channel = c.key
                             AND recipient = suppression_recipient(c.key, r.recipient)
                             AND category = r.category)
                         LIMIT 1) AS s
    """
)

SUPPRESS_MANY = text(
    """
    INSERT INTO suppressions (channel, recipient, reason, kind)
    SELECT * FROM unnest(CAST(:channels AS text[]), CAST(:recipients AS text[]),
                         CAST(:reasons AS text[]), CAST(:kinds AS text[]))
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

# The entry as stored, new or not (the no-op update keeps the first reason, kind and time);
# xmax is 0 for a row this statement inserted.
SUPPRESS_ONE = text(
    """
    INSERT INTO suppressions (channel, recipient, reason, kind)
    VALUES (:channel, :recipient, :reason, 'operator')
    ON CONFLICT (channel, recipient) DO UPDATE SET reason = suppressions.reason
    RETURNING channel, recipient, reason, created_at, kind, xmax = 0
    """
)

# Every entry of the recipient, whatever its kind or category: send to it again.
UNSUPPRESS = text(
    """
    WITH everything AS (
        DELETE FROM suppressions
         WHERE channel = :channel AND recipient = suppression_recipient(:channel, :recipient)
        RETURNING 1),
    scoped AS (
        DELETE FROM category_opt_outs
         WHERE channel = :channel AND recipient = suppression_recipient(:channel, :recipient)
        RETURNING 1)
    SELECT (SELECT count(*) FROM everything) + (SELECT count(*) FROM scoped)
    """
)

# Scoped opt-outs are listed with their category in the kind: ``opt-out:marketing``.
LIST_SUPPRESSIONS = text(
    """
    SELECT channel, recipient, reason, created_at, kind FROM (
        SELECT channel, recipient, reason, created_at, kind FROM suppressions
         WHERE CAST(:channel AS text) IS NULL OR channel = :channel
        UNION ALL
        SELECT channel, recipient, reason, created_at, 'opt-out:' || category
          FROM category_opt_outs
         WHERE CAST(:channel AS text) IS NULL OR channel = :channel) AS e
     ORDER BY created_at DESC, channel, recipient, kind LIMIT :limit
    """
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
    #: ``opt-out``, ``bounce``, ``complaint``, ``invalid``, ``operator``; ``opt-out:CATEGORY``
    #: for an opt-out of one category
    kind: str = "opt-out"


#: What a row is to the suppression list: (channel, recipient, category).
Addressee = tuple[str, str, str | None]


# --- what the dispatcher uses, a batch at a time -------------------------------------------------


def suppressed(conn: Connection, rows: Iterable[Addressee]) -> dict[Addressee, str]:
    """Of these (channel, recipient, category) rows, the suppressed ones, with the reasons."""
    by_channel: dict[str, dict[tuple[str, str | None], None]] = {}
    for channel, recipient, category in rows:
        by_channel.setdefault(channel, {})[recipient, category] = None
    if not by_channel:
        return {}
    batch = json.dumps({channel: list(rs) for channel, rs in by_channel.items()})
    found = conn.execute(SUPPRESSED, {"rows": batch}).all()
    return {
        (channel, recipient, category): reason for channel, recipient, category, reason in found
    }


def suppress_many(conn: Connection, entries: Iterable[tuple[str, str, str, str]]) -> int:
    """Add (channel, recipient, reason, kind) entries; those already there keep their first
    reason and kind. Returns how many were new."""
    channels, recipients, reasons, kinds = _columns(entries, 4)
    if not channels:
        return 0
    params = {"channels": channels, "recipients": recipients, "reasons": reasons, "kinds": kinds}
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
    """Remove every entry of the recipient, of any kind and category; whether there was one."""
    params = {"channel": channel, "recipient": recipient}
    return int(conn.execute(UNSUPPRESS, params).scalar_one()) > 0


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
