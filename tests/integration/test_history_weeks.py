"""The attempt history by week (migration 0027): weeks made ahead, dropped whole past their
retention, the default partition's attempts moved into their week, a week in use left for the
next run, and the history written before the migration carried over."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from notifier import db, ops
from notifier.db import history
from notifier.settings import Settings
from tests.migrations import migrate
from tests.roles import Logins


def _write(engine: Engine, notification_id: int, at: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notification_attempts"
                " (notification_id, attempt, at, worker, channel, outcome)"
                " VALUES (:id, 1, :at, 'w', 'null', 'sent')"
            ),
            {"id": notification_id, "at": at},
        )


def _where(engine: Engine) -> dict[int, str]:
    """Each attempt's notification id -> the partition that holds it."""
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT notification_id, tableoid::regclass::text FROM notification_attempts")
        )
        return {int(i): str(p) for i, p in found}


def _weeks(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                text(
                    "SELECT inhrelid::regclass::text FROM pg_inherits"
                    " WHERE inhparent = 'notification_attempts'::regclass"
                )
            ).scalars()
        )


def _monday(at: datetime) -> datetime:
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def test_migration_leaves_this_week_and_eight_ahead(engine: Engine) -> None:
    monday = _monday(datetime.now(UTC)) + timedelta(days=7)
    ahead = {f"notification_attempts_w{(monday + timedelta(weeks=w)):%Y%m%d}" for w in range(8)}
    names = {"notification_attempts_before", "notification_attempts_default", *ahead}
    assert _weeks(engine) == names
    now = datetime.now(UTC)
    _write(engine, 1, now)
    _write(engine, 2, monday + timedelta(days=8))
    assert _where(engine) == {
        1: "notification_attempts_before",
        2: f"notification_attempts_w{(monday + timedelta(weeks=1)):%Y%m%d}",
    }


def test_weeks_past_the_retention_are_dropped_whole(engine: Engine) -> None:
    now = datetime.now(UTC)
    _write(engine, 1, now - timedelta(days=400))  # in the history written before the weeks
    _write(engine, 2, now + timedelta(days=14))
    _write(engine, 3, now + timedelta(days=120))
    later = now + timedelta(days=120)  # as of four months on, keeping 90 days
    with engine.begin() as conn:
        planned = history.maintain(conn, 90, dry_run=True, at=later)
    assert _where(engine).keys() == {1, 2, 3}  # a dry run changes nothing
    with engine.begin() as conn:  # one week a transaction, the oldest first
        first = history.maintain(conn, 90, at=later, drops=1)
    assert [w.name for w in first if w.action == "dropped"] == ["notification_attempts_before"]
    with engine.begin() as conn:
        done = first + history.maintain(conn, 90, at=later)
    assert sorted((w.name, w.action, w.attempts) for w in planned) == sorted(
        (w.name, w.action, w.attempts) for w in done
    )
    dropped = {w.name: w.attempts for w in done if w.action == "dropped"}
    assert dropped["notification_attempts_before"] == 1
    assert sum(dropped.values()) == 2
    assert _where(engine) == {3: f"notification_attempts_w{_monday(later):%Y%m%d}"}
    made = [w.name for w in done if w.action == "made"]
    assert made[-1] == f"notification_attempts_w{_monday(later) + timedelta(weeks=8):%Y%m%d}"
    assert not set(dropped) & _weeks(engine)


def test_attempts_no_week_was_made_for_wait_in_the_default_and_move_into_their_week(
    engine: Engine,
) -> None:
    far = datetime.now(UTC) + timedelta(weeks=20)
    _write(engine, 7, far)
    assert _where(engine) == {7: "notification_attempts_default"}
    with engine.begin() as conn:
        done = history.maintain(conn, 365, at=far - timedelta(days=1))
    week = f"notification_attempts_w{_monday(far):%Y%m%d}"
    assert (week, "made", 1) in [(w.name, w.action, w.attempts) for w in done]
    assert _where(engine) == {7: week}


def test_a_week_in_use_is_left_for_the_next_run(engine: Engine) -> None:
    now = datetime.now(UTC)
    _write(engine, 1, now - timedelta(days=400))
    reading = threading.Event()
    done = threading.Event()

    def long_read() -> None:  # a long read of the history, holding its lock
        with engine.begin() as conn:
            conn.execute(text("SELECT count(*) FROM notification_attempts")).scalar_one()
            reading.set()
            done.wait(30)

    reader = threading.Thread(target=long_read)
    reader.start()
    try:
        assert reading.wait(10)
        with engine.begin() as conn:
            weeks = history.maintain(conn, 90, at=now + timedelta(days=100))
    finally:
        done.set()
        reader.join(10)
    assert ("notification_attempts_before", "busy") in [(w.name, w.action) for w in weeks]
    assert _where(engine) == {1: "notification_attempts_before"}


def test_purge_drops_the_weeks_past_the_history_retention(
    engine: Engine, settings: Settings
) -> None:
    _write(engine, 1, datetime.now(UTC) - timedelta(days=10))
    report = ops.purge(db.engine(), settings)  # nothing a week old enough: nothing dropped
    assert report.attempts == 0
    assert _where(engine) == {1: "notification_attempts_before"}


@pytest.mark.parametrize(("role", "may"), [("notifier_worker", True), ("notifier_producer", False)])
def test_who_may_drop_weeks(engine: Engine, database_url: str, role: str, may: bool) -> None:
    logins = Logins(engine, database_url)
    try:
        user = db.make_engine(logins.url(logins.make(role)))
        next_week = datetime.now(UTC) + timedelta(days=7)
        if may:  # the daily purge runs on the workers
            with user.begin() as conn:
                assert [w.action for w in history.maintain(conn, 90, at=next_week)] == ["made"]
        else:
            with pytest.raises(DBAPIError, match="permission denied"), user.begin() as conn:
                history.maintain(conn, 90, at=next_week)
        with (
            pytest.raises(DBAPIError, match=r"must be owner|permission denied"),
            user.begin() as conn,
        ):
            conn.execute(text("DROP TABLE notification_attempts_default"))
        user.dispose()
    finally:
        logins.drop()


def test_history_written_before_the_migration_is_kept_and_ids_go_on(engine: Engine) -> None:
    migrate(engine, "0026")
    with engine.begin() as conn:
        before = (
            conn.execute(
                text(
                    "INSERT INTO notification_attempts (notification_id, attempt, worker, channel,"
                    " outcome) SELECT n, 1, 'w', 'null', 'sent' FROM generate_series(1, 3) n"
                    " RETURNING id"
                )
            )
            .scalars()
            .all()
        )
    migrate(engine, "head")
    _write(engine, 4, datetime.now(UTC))
    with engine.connect() as conn:
        ids = dict(
            conn.execute(text("SELECT notification_id, id FROM notification_attempts")).all()
        )
    assert [ids[n] for n in (1, 2, 3)] == before
    assert ids[4] > max(before)
    assert set(_where(engine).values()) == {"notification_attempts_before"}
