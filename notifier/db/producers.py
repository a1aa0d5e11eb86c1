"""The producers' statements: enqueue and cancel, inside the caller's own transaction.

They run on a SQLAlchemy ``Connection`` or on a psycopg 3 connection, whichever the producer
holds; nothing here commits.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

import psycopg
from sqlalchemy import Connection, text

from notifier.db import profiles
from notifier.db.engine import driver, driver_errors
from notifier.db.sql import for_driver
from notifier.db.templates import TEMPLATES_OF, TemplateRow
from notifier.models import Profile

ENQUEUE = """
    INSERT INTO notifications
           (channel, recipient, subject, body, payload, dedupe_key, max_attempts, priority,
            next_attempt_at, expires_at, guard, template, locale, category, profile)
    VALUES (:channel, :recipient, :subject, :body, CAST(:payload AS jsonb), :dedupe_key,
            :max_attempts, :priority, coalesce(CAST(:send_at AS timestamptz), now()),
            CAST(:expires_at AS timestamptz), :guard, :template, :locale,
            CAST(:category AS text), CAST(:profile AS text))
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
"""

ID_BY_DEDUPE_KEY = "SELECT id FROM notifications WHERE dedupe_key = :dedupe_key"

# A claimed row can be cancelled too: its worker checks again just before sending, and its
# later outcome write, guarded by status, changes nothing.
CANCEL_BY_KEY = """
    UPDATE notifications
       SET status = 'cancelled', updated_at = now(), locked_until = NULL,
           last_error = :reason
     WHERE dedupe_key = :dedupe_key AND status IN ('pending', 'processing')
    RETURNING id
"""

CANCEL_BY_ID = """
    UPDATE notifications
       SET status = 'cancelled', updated_at = now(), locked_until = NULL,
           last_error = :reason
     WHERE id = :id AND status IN ('pending', 'processing')
    RETURNING id
"""

PROFILE_OF = "SELECT email, phone, push_tokens[1:20], locale, fields FROM profiles WHERE id = :id"

ProducerConnection = Connection | psycopg.Connection[Any]


def enqueue_row(conn: ProducerConnection, values: Mapping[str, Any]) -> tuple[int, bool]:
    """Insert one notification; ``(id, True)`` if new, ``(id, False)`` if its key existed."""
    row = _producer_execute(conn, ENQUEUE, values)
    if row is not None:
        return int(row[0]), True
    existing = _producer_execute(conn, ID_BY_DEDUPE_KEY, {"dedupe_key": values["dedupe_key"]})
    if existing is None:  # the conflicting row was deleted between the two statements
        return enqueue_row(conn, values)
    return int(existing[0]), False


#: What a row to write names, with the type it is staged as.
_STAGED_TYPES = (
    ("channel", "text"),
    ("recipient", "text"),
    ("subject", "text"),
    ("body", "text"),
    ("payload", "jsonb"),
    ("dedupe_key", "text"),
    ("max_attempts", "integer"),
    ("priority", "integer"),
    ("send_at", "timestamptz"),
    ("expires_at", "timestamptz"),
    ("guard", "text"),
    ("template", "text"),
    ("locale", "text"),
    ("category", "text"),
    ("profile", "text"),
)
STAGED = tuple(name for name, _type in _STAGED_TYPES)
_STAGED_VALUES = itemgetter(*STAGED)
ROW_COLUMNS = ", ".join(f"{name} {type_}" for name, type_ in _STAGED_TYPES)

# Rows in the order given (their ids too, as identity values are drawn in that order); a row
# whose dedupe_key exists is left out of what comes back. The rows arrive by COPY into a
# session's own staging table, stamped with the call that staged them: no JSON to build or
# parse, and the table emptied at commit, in one go, not row by row (a DELETE of the staged
# rows cost PostgreSQL about 1.5 us a row of the 13 the statements took). A second call in the
# same transaction reads its own rows only.
STAGE_ROWS = f"""
    CREATE TEMP TABLE IF NOT EXISTS notifications_staging (call bigint, ord integer, {ROW_COLUMNS})
    ON COMMIT DELETE ROWS
"""
COPY_STAGED = f"COPY notifications_staging (call, ord, {', '.join(STAGED)}) FROM STDIN"
ENQUEUE_STAGED = """
    INSERT INTO notifications
           (channel, recipient, subject, body, payload, dedupe_key, max_attempts, priority,
            next_attempt_at, expires_at, guard, template, locale, category, profile)
    SELECT channel, recipient, subject, body, payload, dedupe_key, max_attempts, priority,
           coalesce(send_at, now()), expires_at, guard, template, locale, category, profile
      FROM notifications_staging
     WHERE call = %(call)s
     ORDER BY ord
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id, dedupe_key
"""
#: Each call's stamp on the rows it stages.
_CALLS = itertools.count()


def enqueue_rows(
    conn: Connection, rows: Sequence[Mapping[str, Any]]
) -> list[tuple[int, str | None]]:
    """Insert rows (each as ``enqueue_row`` takes it, its payload JSON text) in one statement,
    in ``conn``'s transaction: (id, dedupe_key) of each written, in the order given; a row whose
    key existed is not among them. One row is one plain INSERT (one round trip, where staging
    takes three)."""
    if len(rows) == 1:
        written = _producer_execute(conn, ENQUEUE, rows[0])
        return [] if written is None else [(int(written[0]), rows[0]["dedupe_key"])]
    raw = driver(conn)
    with driver_errors(conn), raw.cursor() as cur:
        call = next(_CALLS)
        cur.execute(STAGE_ROWS)
        with cur.copy(COPY_STAGED) as copy:
            for ord_, row in enumerate(rows):
                copy.write_row((call, ord_, *_STAGED_VALUES(row)))
        cur.execute(ENQUEUE_STAGED, {"call": call})
        return sorted((int(i), key) for i, key in cur.fetchall())


def cancel_by_key(conn: ProducerConnection, dedupe_key: str, reason: str) -> int | None:
    """Cancel the unsent row with this key; its id, or ``None`` if none was waiting."""
    row = _producer_execute(conn, CANCEL_BY_KEY, {"dedupe_key": dedupe_key, "reason": reason})
    return None if row is None else int(row[0])


def cancel_by_id(conn: ProducerConnection, row_id: int, reason: str) -> bool:
    """Cancel this row if it has not been sent; whether it was."""
    return _producer_execute(conn, CANCEL_BY_ID, {"id": row_id, "reason": reason}) is not None


def profile(conn: ProducerConnection, profile_id: str) -> Profile | None:
    """The profile's addresses, locale and fields as the caller's transaction sees them (for
    the intake's check of a row addressed to it), or ``None`` if it has none by that id."""
    row = _producer_execute(conn, PROFILE_OF, {"id": profile_id})
    if row is None:
        return None
    email, phone, tokens, locale, fields = row
    return Profile(
        profile_id,
        email=email,
        phone=phone,
        push_tokens=tuple(tokens),
        locale=locale,
        fields=fields,
    )


def upsert_profile(conn: ProducerConnection, profile_id: str, values: Mapping[str, Any]) -> None:
    """Create the profile or change the columns ``values`` names (``fields`` as JSON text)."""
    _producer_execute(conn, profiles.upsert_statement(values), {**values, "id": profile_id})


def templates_of(conn: ProducerConnection, name: str, channel: str) -> list[TemplateRow]:
    """Every locale of one stored template, the dispatcher's query (``templates.templates_of``)
    on either kind of connection, so that a producer's row is checked against it."""
    params = {"names": [name], "channels": [channel]}
    if isinstance(conn, Connection):
        return [TemplateRow(*row) for row in conn.execute(TEMPLATES_OF, params).all()]
    with conn.cursor() as cur:
        cur.execute(for_driver(str(TEMPLATES_OF)), params)
        return [TemplateRow(*row) for row in cur.fetchall()]


def _producer_execute(
    conn: ProducerConnection, sql: str, params: Mapping[str, Any]
) -> tuple[Any, ...] | None:
    """Run one statement on a SQLAlchemy or a psycopg connection, inside its transaction."""
    if isinstance(conn, Connection):
        row = conn.execute(text(sql), {"category": None, **params}).first()
        return None if row is None else tuple(row)
    with conn.cursor() as cur:
        cur.execute(for_driver(sql), {"category": None, **params})
        return cur.fetchone()
