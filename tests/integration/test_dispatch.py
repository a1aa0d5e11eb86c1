"""The dispatcher against a real PostgreSQL: claims, statuses, bad rows, backlogs."""

from __future__ import annotations

import pytest
from pytest_httpserver import HTTPServer
from sqlalchemy import Engine, text
from werkzeug import Request, Response

from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import load_registry, registry_of
from notifier.providers.null import NullProvider
from notifier.settings import Settings, get_settings


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
    fixed = settings.model_copy(update={"max_batch_size": settings.batch_size})
    dispatcher = Dispatcher(engine, registry_of([NullProvider(Settings())]), fixed)
    reports = dispatcher.drain(on_full_batch=lambda: calls.append(1))
    dispatcher.close()
    assert [r.claimed for r in reports] == [50, 50, 50, 50, 50, 10]
    assert len(calls) == 5
    assert _rows(engine, "SELECT status, attempts, count(*) FROM notifications GROUP BY 1, 2") == [
        ("sent", 1, 260)
    ]


def test_batches_grow_while_a_backlog_remains_and_start_small_again(
    engine: Engine, settings: Settings
) -> None:
    """The first claim is ``batch_size``; after a full one the next claims what half a second
    of sends at that pace takes, up to ``max_batch_size``; a short batch ends the drain, and
    the next drain starts small again."""
    _rows(
        engine,
        "INSERT INTO notifications (channel, recipient)"
        " SELECT 'null', 'x' FROM generate_series(1, 3000) RETURNING id",
    )
    grown = settings.model_copy(update={"max_batch_size": 400})
    dispatcher = Dispatcher(engine, registry_of([NullProvider(Settings())]), grown)
    try:
        first = [r.claimed for r in dispatcher.drain(budget_seconds=120)]
        _rows(
            engine,
            "INSERT INTO notifications (channel, recipient)"
            " SELECT 'null', 'x' FROM generate_series(1, 60) RETURNING id",
        )
        second = [r.claimed for r in dispatcher.drain(budget_seconds=120)]
    finally:
        dispatcher.close()
    assert first[0] == 50
    # null rows go fast (far over 100 a second on any machine): the claims grew, to the bound
    assert 50 < max(first) <= 400
    assert all(50 <= c <= 400 for c in first[:-1])
    assert sum(first) == 3000
    assert second == [50, 10]


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
    Dispatcher(engine, registry_of([NullProvider(Settings())]), settings).run_once()
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
    report = Dispatcher(engine, registry_of([NullProvider(Settings())]), settings).run_once()
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
    Dispatcher(engine, registry_of([NullProvider(Settings())]), settings).run_once()
    assert _rows(engine, "SELECT status FROM notifications WHERE recipient = 'urgent'") == [
        ("sent",)
    ]


def test_providers_are_called_outside_any_transaction(
    engine: Engine, settings: Settings, httpserver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the receiver handles the request, the claim is committed and no transaction is open."""
    monkeypatch.setenv("NOTIFIER_WEBHOOK_ALLOW_HTTP", "true")
    monkeypatch.setenv("NOTIFIER_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")  # loopback
    get_settings.cache_clear()
    seen: list[tuple[object, ...]] = []

    def handler(request: Request) -> Response:
        with engine.connect() as conn:
            seen.append(
                tuple(
                    conn.execute(
                        text(
                            "SELECT (SELECT status FROM notifications),"
                            " (SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND state LIKE 'idle in transaction%')"
                        )
                    ).one()
                )
            )
        return Response("ok")

    httpserver.expect_request("/hook", method="POST").respond_with_handler(handler)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO notifications (channel, recipient) VALUES ('webhook', :url)"),
            {"url": httpserver.url_for("/hook")},
        )
    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings)
    assert dispatcher.run_once().sent == 1
    dispatcher.close()
    assert seen == [("processing", 0)]


def test_server_errors_back_off_then_dead_with_the_last_error(
    engine: Engine, settings: Settings, httpserver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFIER_WEBHOOK_ALLOW_HTTP", "true")
    monkeypatch.setenv("NOTIFIER_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")  # loopback
    get_settings.cache_clear()
    httpserver.expect_request("/hook").respond_with_data("overloaded", status=503)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, max_attempts)"
                " VALUES ('webhook', :url, 3)"
            ),
            {"url": httpserver.url_for("/hook")},
        )
    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings)
    waits = []
    for _ in range(3):
        _rows(engine, "UPDATE notifications SET next_attempt_at = now() RETURNING id")
        dispatcher.run_once()
        waits.extend(
            _rows(
                engine,
                "SELECT extract(epoch FROM next_attempt_at - updated_at)::float8, status,"
                " attempts, last_error FROM notifications",
            )
        )
    dispatcher.close()
    # base 1 s doubling, 20 % jitter taken off: [0.8, 1] then [1.6, 2]; then given up.
    assert 0.8 <= waits[0][0] <= 1.0
    assert 1.6 <= waits[1][0] <= 2.0
    assert [w[1:3] for w in waits] == [("pending", 1), ("pending", 2), ("dead", 3)]
    host = f"{httpserver.host}:{httpserver.port}"
    assert waits[2][3] == f"gave up after 3 attempts; last error: HTTP 503 from {host}: overloaded"
    assert len(httpserver.log) == 3


def test_every_attempt_is_kept_in_the_history(
    engine: Engine, settings: Settings, httpserver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFIER_WEBHOOK_ALLOW_HTTP", "true")
    monkeypatch.setenv("NOTIFIER_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")
    get_settings.cache_clear()
    answers = iter([Response("busy", status=503), Response("ok")])
    httpserver.expect_request("/hook").respond_with_handler(lambda request: next(answers))
    (row_id,) = _rows(
        engine,
        "INSERT INTO notifications (channel, recipient) VALUES ('webhook', :url) RETURNING id",
        url=httpserver.url_for("/hook"),
    )[0]
    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings, worker="w-test")
    dispatcher.run_once()
    _rows(engine, "UPDATE notifications SET next_attempt_at = now() RETURNING id")
    dispatcher.run_once()
    dispatcher.close()
    history = _rows(
        engine,
        "SELECT attempt, worker, channel, outcome, error LIKE 'HTTP 503%', duration_ms >= 0"
        " FROM notification_attempts WHERE notification_id = :id ORDER BY id",
        id=row_id,
    )
    assert history == [
        (1, "w-test", "webhook", "retry", True, True),
        (2, "w-test", "webhook", "sent", None, True),
    ]
