"""The SQL of the suppression list: what the dispatcher checks a batch against, and the
entries that events and operators add and remove.

Part of ``notifier.db``, the package that talks to the driver; ``notifier.delivery.prepare``
sees none of it. The dispatcher's lookup takes a whole batch at once, so a batch costs one
statement, never one per row.

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
from typing import Any

import psycopg
from sqlalchemy import Connection, text

from notifier.db.engine import driver, driver_errors
from notifier.db.sql import columns, for_driver

# The batch's rows travel as one JSON object, {channel: [[recipient, category], ...]}: psycopg
# adapts a text[] an element at a time in Python (milliseconds for a batch of 500), json.dumps
# in C. A channel with no entry in either table costs two index probes (min() reads a primary
# key's first entry), not one per row: a batch of such rows is all but free. Otherwise one
# primary-key probe per row in suppressions and, if that finds nothing, one in
# category_opt_outs; the LIMIT keeps the planner from flattening the last subquery into a join
# it might hash, whatever it guesses about the JSON's size, and stops at the first probe that
# finds an entry.
SUPPRESSED = for_driver(
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

SUPPRESS_MANY = for_driver(
    """
    INSERT INTO suppressions (channel, recipient, reason, kind)
    SELECT * FROM unnest(CAST(:channels AS text[]), CAST(:recipients AS text[]),
                         CAST(:reasons AS text[]), CAST(:kinds AS text[]))
    ON CONFLICT (channel, recipient) DO NOTHING
    """
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
_OF = """(CAST(:channel AS text) IS NULL OR channel = :channel)
           AND (CAST(:recipient AS text) IS NULL
                OR recipient = suppression_recipient(channel, :recipient))"""

LIST_SUPPRESSIONS = text(
    f"""
    SELECT channel, recipient, reason, created_at, kind FROM (
        SELECT channel, recipient, reason, created_at, kind FROM suppressions
         WHERE {_OF}
        UNION ALL
        SELECT channel, recipient, reason, created_at, 'opt-out:' || category
          FROM category_opt_outs
         WHERE {_OF}) AS e
     ORDER BY created_at DESC, channel, recipient, kind LIMIT :limit
    """
)


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
    with driver_errors(conn):
        return found_suppressed(send_suppressed(driver(conn), rows))


def send_suppressed(
    conn: psycopg.Connection[Any], rows: Iterable[Addressee]
) -> psycopg.Cursor[Any] | None:
    """``suppressed``'s statement, executed on the driver's connection (queued, in a
    ``trips.one_trip``): its cursor for ``found_suppressed``, or ``None`` without rows."""
    by_channel: dict[str, dict[tuple[str, str | None], None]] = {}
    for channel, recipient, category in rows:
        by_channel.setdefault(channel, {})[recipient, category] = None
    if not by_channel:
        return None
    batch = json.dumps({channel: list(rs) for channel, rs in by_channel.items()})
    return conn.execute(SUPPRESSED, {"rows": batch})


def found_suppressed(cur: psycopg.Cursor[Any] | None) -> dict[Addressee, str]:
    """What a ``send_suppressed`` found: each suppressed row's reason."""
    found = cur.fetchall() if cur is not None else []
    return {
        (channel, recipient, category): reason for channel, recipient, category, reason in found
    }


def suppress_many(conn: Connection, entries: Iterable[tuple[str, str, str, str]]) -> int:
    """Add (channel, recipient, reason, kind) entries; those already there keep their first
    reason and kind. Returns how many were new."""
    with driver_errors(conn):
        return added(send_suppress_many(driver(conn), entries))


def send_suppress_many(
    conn: psycopg.Connection[Any], entries: Iterable[tuple[str, str, str, str]]
) -> psycopg.Cursor[Any] | None:
    """``suppress_many``'s statement, executed on the driver's connection (queued, in a
    ``trips.one_trip``): its cursor for ``added``, or ``None`` when there is no entry."""
    channels, recipients, reasons, kinds = columns(entries, 4)
    if not channels:
        return None
    params = {"channels": channels, "recipients": recipients, "reasons": reasons, "kinds": kinds}
    return conn.execute(SUPPRESS_MANY, params)


def added(cur: psycopg.Cursor[Any] | None) -> int:
    """How many entries a ``send_suppress_many`` added."""
    return 0 if cur is None else int(cur.rowcount)


# --- what operators use --------------------------------------------------------------------------


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


def list_suppressions(
    conn: Connection, channel: str | None, limit: int, recipient: str | None = None
) -> list[Suppression]:
    """The newest ``limit`` entries, of one channel or all, or only those of ``recipient``."""
    params = {"channel": channel, "recipient": recipient, "limit": limit}
    return [Suppression(*row) for row in conn.execute(LIST_SUPPRESSIONS, params).all()]
