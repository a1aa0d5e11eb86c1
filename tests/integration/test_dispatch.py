"""The dispatcher against a real PostgreSQL: claims, statuses, bad rows, backlogs."""

from __future__ import annotations

from sqlalchemy import Engine, text

from notifier.dispatch import Dispatcher
from notifier.providers import Registry
from notifier.providers.null import NullProvider
from notifier.settings import Settings


def _rows(engine: Engine, sql: str, **params: object) -> list[tuple[object, ...]]:
    with engine.begin() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params).all()]


def _statuses(engine: Engine) -> dict[int, tuple[object, ...]]:
    rows = _rows(engine, "SELECT id, status, attempts, last_error FROM notifications ORDER BY id")
    return {int(r[0]): r[1:] for r in rows}  # type: ignore[call-overload]


def test_backlog_drains_in_full_batches(engine: Engine, settings: Settings) -> None:
    _rows(
        engine,
        "INSERT INTO notifications (channel, recipient)"
        " SELECT 'null', 'x' FROM generate_series(1, 260)"
        " RETURNING id",
    )
    calls: list[int] = []
    dispatcher = Dispatcher(engine, Registry([NullProvider()]), settings)
    reports = dispatcher.drain(on_full_batch=lambda: calls.append(1))
    dispatcher.close()
    assert [r.claimed for r in reports] == [50, 50, 50, 50, 50, 10]
    assert len(calls) == 5
    assert _rows(engine, "SELECT status, attempts, count(*) FROM notifications GROUP BY 1, 2") == [
        ("sent", 1, 260)
    ]


def test_bad_rows_go_dead_with_a_reason_and_block_nothing(
    engine: Engine, settings: Settings
) -> None:
    _rows(
        engine,
        """
        INSERT INTO notifications (channel, recipient, payload, priority) VALUES
          ('pigeon', 'x', '{}', 10),
          ('null', 'x', '[1, 2]', 10),
          ('null', 'x', '"text"', 10),
          ('null', 'ok', '{}', 0)
        RETURNING id
        """,
    )
    Dispatcher(engine, Registry([NullProvider()]), settings).run_once()
    rows = _statuses(engine)
    assert rows[1] == ("dead", 1, "unknown channel 'pigeon'; this deployment serves: null")
    assert rows[2] == ("dead", 1, "invalid notification: payload must be a JSON object, not list")
    assert rows[3] == ("dead", 1, "invalid notification: payload must be a JSON object, not str")
    assert rows[4] == ("sent", 1, None)


def test_only_due_pending_rows_are_claimed(engine: Engine, settings: Settings) -> None:
    _rows(
        engine,
        """
        INSERT INTO notifications (channel, recipient, status, next_attempt_at) VALUES
          ('null', 'due', 'pending', now() - interval '1 second'),
          ('null', 'later', 'pending', now() + interval '1 hour'),
          ('null', 'cancelled', 'cancelled', now())
        RETURNING id
        """,
    )
    report = Dispatcher(engine, Registry([NullProvider()]), settings).run_once()
    assert report.claimed == 1
    assert [s for (s,) in _rows(engine, "SELECT status FROM notifications ORDER BY id")] == [
        "sent",
        "pending",
        "cancelled",
    ]


def test_higher_priority_is_claimed_first(engine: Engine, settings: Settings) -> None:
    _rows(
        engine,
        "INSERT INTO notifications (channel, recipient, priority, next_attempt_at)"
        " SELECT 'null', 'bulk', 0, now() - interval '1 hour' FROM generate_series(1, 120)"
        " RETURNING id",
    )
    _rows(
        engine,
        "INSERT INTO notifications (channel, recipient, priority) VALUES ('null', 'urgent', 10)"
        " RETURNING id",
    )
    Dispatcher(engine, Registry([NullProvider()]), settings).run_once()
    assert _rows(engine, "SELECT status FROM notifications WHERE recipient = 'urgent'") == [
        ("sent",)
    ]
