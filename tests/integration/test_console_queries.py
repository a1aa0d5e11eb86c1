"""The console's list: keyset pages walk the primary key, never sort the table, and time
ranges become id ranges that keep every row of the range."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from notifier.db import listing

ROWS = 30_000


@pytest.fixture
def filled(engine: Engine) -> Engine:
    """ROWS rows created a minute apart, oldest first, mostly sent; planner statistics read."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status, sent_at, last_error,"
                " created_at) SELECT CASE WHEN g % 3 = 0 THEN 'sms' ELSE 'email' END,"
                " 'u' || g || '@example.com', CASE WHEN g % 50 = 0 THEN 'dead' ELSE 'sent' END,"
                " CASE WHEN g % 50 = 0 THEN NULL ELSE now() END,"
                " CASE WHEN g % 50 = 0 THEN 'gave up' END,"
                " now() - (:rows - g) * interval '1 minute' FROM generate_series(1, :rows) g"
            ),
            {"rows": ROWS},
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
    return engine


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"before": ROWS // 2},
        {"status": "dead"},
        {"channel": "sms", "status": "sent"},
        {"error": "gave"},
        {"min_id": ROWS - 2000, "max_id": ROWS - 1000, "since": datetime(2000, 1, 1, tzinfo=UTC)},
    ],
)
def test_a_page_never_scans_or_sorts_the_table(filled: Engine, filters: dict[str, object]) -> None:
    """Either the primary key walked backwards (no sort), or the few rows of a partial index
    (dead rows by time of death) sorted; never the whole table read or sorted."""
    with filled.connect() as conn:
        plan = listing.explain_list(conn, {**filters, "limit": listing.PAGE + 1})
    assert "Seq Scan on notifications" not in plan, plan
    if "Sort" in plan:
        assert "Index Scan using notifications_dead on notifications" in plan, plan
    else:
        assert "Index Scan Backward using notifications_pkey" in plan, plan


def test_pages_follow_each_other_without_gaps(filled: Engine) -> None:
    seen: list[int] = []
    before = None
    with filled.begin() as conn:
        for _ in range(3):
            rows = listing.list_rows(conn, {"status": "dead", "before": before, "limit": 51})
            seen += [r["id"] for r in rows[:50]]
            before = rows[49]["id"]
    expected = list(range(ROWS - ROWS % 50, 0, -50))[:150]
    assert seen == expected


def test_a_time_range_becomes_an_id_range_that_keeps_every_row_in_it(filled: Engine) -> None:
    with filled.begin() as conn:
        now = conn.execute(text("SELECT max(created_at) FROM notifications")).scalar_one()
        since, until = now - timedelta(hours=30), now - timedelta(hours=20)
        low, high = listing.id_at(conn, since), listing.id_after(conn, until)
        inside = conn.execute(
            text(
                "SELECT min(id), max(id) FROM notifications"
                " WHERE created_at >= :since AND created_at < :until"
            ),
            {"since": since, "until": until},
        ).one()
        rows = listing.list_rows(
            conn,
            {"since": since, "until": until, "min_id": low, "max_id": high, "limit": 1000},
        )
    assert low <= inside[0]
    assert inside[1] < high
    # the id range is only a little wider than the time range (the allowed skew), not the table
    assert high - low < 700 + 3 * 60
    assert len(rows) == 600
    assert [r["id"] for r in rows] == list(range(inside[1], inside[0] - 1, -1))
