"""The SQL of one notification's story: the row, its attempt history, and the history row an
operator's action writes.

Part of ``notifier.db``, the package that talks to the driver. ``notifier show`` and the
console's page of one row both read these.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

# Every column, and the campaign by its name.
ONE = text(
    """
    SELECT n.*, c.name AS campaign
      FROM notifications n LEFT JOIN campaigns c ON c.id = n.campaign_id
     WHERE n.id = :id
    """
)

HISTORY = text(
    """
    SELECT attempt, at, worker, provider, channel, outcome, error, duration_ms
      FROM notification_attempts
     WHERE notification_id = :id
     ORDER BY id
    """
)

# An operator's action in the row's history: the worker column names the operator.
RECORD_ACTION = text(
    """
    INSERT INTO notification_attempts (notification_id, attempt, worker, channel, outcome, error)
    SELECT id, attempts, :who, channel, :outcome, :reason FROM notifications WHERE id = :id
    """
)


def notification(conn: Connection, row_id: int) -> dict[str, Any] | None:
    """Every column by name, and ``campaign``, its campaign's name; ``None`` if there is no
    such row."""
    row = conn.execute(ONE, {"id": row_id}).mappings().first()
    return None if row is None else dict(row)


def history(conn: Connection, row_id: int) -> list[dict[str, Any]]:
    """The row's attempts, oldest first."""
    return [dict(r) for r in conn.execute(HISTORY, {"id": row_id}).mappings()]


def record_action(conn: Connection, row_id: int, who: str, outcome: str, reason: str) -> None:
    """``outcome`` (``requeued``, ``cancelled``) by the console user ``who``, in the row's
    history, in the caller's transaction (the one that changed the row)."""
    params = {"id": row_id, "who": f"console:{who}", "outcome": outcome, "reason": reason}
    conn.execute(RECORD_ACTION, params)
