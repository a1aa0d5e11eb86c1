"""The producers' statements: enqueue and cancel, inside the caller's own transaction.

They run on a SQLAlchemy ``Connection`` or on a psycopg 3 connection, whichever the producer
holds; nothing here commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

import psycopg
from sqlalchemy import Connection, text

from notifier.db import profiles
from notifier.db.sql import for_driver
from notifier.db.templates import TEMPLATES_OF, TemplateRow
from notifier.models import Profile

#: The columns a producer's row is written with, and the values of ``enqueue_row``'s for them
#: (each of a type of its own: they may be selected, not only be a row's VALUES).
INSERTED = """channel, recipient, subject, body, payload, dedupe_key, max_attempts, priority,
              next_attempt_at, expires_at, guard, template, locale, category, profile"""
VALUES = """:channel, :recipient, :subject, :body, CAST(:payload AS jsonb), :dedupe_key,
            CAST(:max_attempts AS integer), CAST(:priority AS integer),
            coalesce(CAST(:send_at AS timestamptz), now()),
            CAST(:expires_at AS timestamptz), :guard, :template, :locale,
            CAST(:category AS text), CAST(:profile AS text)"""

ENQUEUE = f"""
    INSERT INTO notifications ({INSERTED})
    VALUES ({VALUES})
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


#: What a row to write names, with the type it is staged as (a batch's rows are copied into a
#: table of these columns: ``notifier.db.api.write_requests``).
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
#: A row's values in the order of ``STAGED``.
STAGED_VALUES = itemgetter(*STAGED)
#: The columns of a table rows are staged in.
ROW_COLUMNS = ", ".join(f"{name} {type_}" for name, type_ in _STAGED_TYPES)
#: The values ``INSERTED`` takes from such a table.
FROM_STAGED = """channel, recipient, subject, body, payload, dedupe_key, max_attempts, priority,
                 coalesce(send_at, now()), expires_at, guard, template, locale, category,
                 profile"""


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
