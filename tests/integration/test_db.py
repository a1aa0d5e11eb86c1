"""The statements of ``notifier.db`` against a real PostgreSQL."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, text

from notifier.db import queue, rescue
from tests.factories import MakeRow, MakeRows


def test_claim_is_exclusive_and_counts_the_attempt(engine: Engine, make_rows: MakeRows) -> None:
    ids = make_rows(5)
    with engine.begin() as conn:
        first = queue.claim_due(conn, limit=3, lease_seconds=60, token=uuid.uuid4(), worker="a")
    with engine.begin() as conn:
        second = queue.claim_due(conn, limit=10, lease_seconds=60, token=uuid.uuid4(), worker="b")
    assert len(first) == 3
    assert len(second) == 2
    assert {n.id for n in first} | {n.id for n in second} == set(ids)
    assert all(n.attempts == 1 for n in first + second)


def test_late_write_with_an_old_token_changes_nothing(engine: Engine, make_row: MakeRow) -> None:
    row_id = make_row()
    old = uuid.uuid4()
    with engine.begin() as conn:
        queue.claim_due(conn, limit=1, lease_seconds=60, token=old, worker="a")
        conn.execute(text("UPDATE notifications SET locked_until = now() - interval '1s'"))
        assert rescue.rescue_expired(conn) == {"pending": 1, "dead": 0}
        new = uuid.uuid4()
        assert len(queue.claim_due(conn, limit=1, lease_seconds=60, token=new, worker="b")) == 1
        assert queue.mark_sent(conn, old, {row_id: "late"}, {}) == 0
        assert queue.mark_sent(conn, new, {row_id: "ok"}, {row_id: "null"}) == 1
        row = conn.execute(text("SELECT status, attempts, rescues FROM notifications")).one()
        history = conn.execute(
            text("SELECT attempt, worker, outcome FROM notification_attempts")
        ).all()
    assert tuple(row) == ("sent", 2, 1)
    assert [tuple(h) for h in history] == [(1, "a", "rescued")]
