"""Wake-ups: the ``LISTEN`` connection that hears of inserted rows, and the next delayed row."""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import Connection, text

from notifier.db.engine import own_connection

NEXT_WAKE = text(
    """
    SELECT extract(epoch FROM min(next_attempt_at))::float8
      FROM notifications
     WHERE status = 'pending' AND next_attempt_at > now()
    """
)

#: The channel the ``notifications_wake`` trigger notifies on every INSERT of pending rows.
WAKE_CHANNEL = "notifier_wake"


def listen(database_url: str) -> psycopg.Connection[Any]:
    """A connection of its own, LISTENing for the wake-ups of inserted rows."""
    conn = own_connection(database_url, application_name="notifier-wake")
    conn.execute(f"LISTEN {WAKE_CHANNEL}")
    return conn


def next_wake(conn: Connection) -> float | None:
    """Unix time at which the earliest delayed pending row falls due, if any."""
    value = conn.execute(NEXT_WAKE).scalar()
    return None if value is None else float(value)
