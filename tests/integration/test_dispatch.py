"""The dispatcher against a real PostgreSQL: claims, statuses, bad rows, backlogs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pytest_httpserver import HTTPServer
from sqlalchemy import Engine, text
from werkzeug import Request, Response

from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import load_registry, registry_of
from notifier.providers.null import NullProvider
from notifier.settings import Settings, get_settings
from tests.factories import MakeRow, MakeRows, MakeSettings, SetEnv, ago, from_now

LOOPBACK = "127.0.0.0/8,::1/128"


def _rows(engine: Engine, sql: str, **params: object) -> list[tuple[object, ...]]:
    with engine.begin() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params).all()]


def _statuses(engine: Engine) -> dict[int, tuple[object, ...]]:
    rows = _rows(engine, "SELECT id, status, attempts, last_error FROM notifications ORDER BY id")
    return {int(r[0]): r[1:] for r in rows}  # type: ignore[call-overload]


def test_a_backlog_drains_in_full_claims_of_one_batch(
    engine: Engine, make_settings: MakeSettings, make_rows: MakeRows
) -> None:
    make_rows(260)
    calls: list[int] = []
    fixed = make_settings(batch_size=50, max_batch_size=50)
    dispatcher = Dispatcher(engine, registry_of([NullProvider(Settings())]), fixed)
    reports = dispatcher.drain(on_full_batch=lambda: calls.append(1))
    dispatcher.close()
    # the batch claims more as its rows are under way, until a claim comes back short
    assert [r.claims for r in reports] == [[50, 50, 50, 50, 50, 10]]
    assert len(calls) == 5
    assert _rows(engine, "SELECT status, attempts, count(*) FROM notifications GROUP BY 1, 2") == [
        ("sent", 1, 260)
    ]


def test_batches_grow_while_a_backlog_remains_and_start_small_again(
    engine: Engine, make_settings: MakeSettings, make_rows: MakeRows
) -> None:
    """The first claim is ``batch_size``; after a full one the next claims what half a second
    of sends at that pace takes, up to ``max_batch_size``; a short claim ends the drain, and
    the next drain starts small again."""
    make_rows(3000)
    grown = make_settings(max_batch_size=400)
    dispatcher = Dispatcher(engine, registry_of([NullProvider(Settings())]), grown)
    try:
        first = [c for r in dispatcher.drain(budget_seconds=120) for c in r.claims]
        make_rows(60)
        second = [c for r in dispatcher.drain(budget_seconds=120) for c in r.claims]
    finally:
        dispatcher.close()
    assert first[0] == 50
    # null rows go fast (far over 100 a second on any machine): the claims grew, to the bound
    assert 50 < max(first) <= 400
    assert all(50 <= c <= 400 for c in first[:-1])
    assert sum(first) == 3000
    assert second == [50, 10]


def test_bad_rows_go_dead_with_a_reason_and_block_nothing(
    engine: Engine, settings: Settings, raw_row: MakeRow
) -> None:
    raw_row(channel="pigeon", recipient="x", payload="{}", priority=10)
    raw_row(channel="null", recipient="x", payload="[1, 2]", priority=10)
    raw_row(channel="null", recipient="x", payload='"text"', priority=10)
    raw_row(channel="null", recipient="ok", payload="{}", priority=0)
    Dispatcher(engine, registry_of([NullProvider(Settings())]), settings).run_once()
    rows = _statuses(engine)
    assert rows[1] == ("dead", 1, "unknown channel 'pigeon'; this deployment serves: null")
    assert rows[2] == ("dead", 1, "invalid notification: payload must be a JSON object, not list")
    assert rows[3] == ("dead", 1, "invalid notification: payload must be a JSON object, not str")
    assert rows[4] == ("sent", 1, None)


def test_only_due_pending_rows_are_claimed(
    engine: Engine, settings: Settings, make_row: MakeRow
) -> None:
    make_row(recipient="due", status="pending", next_attempt_at=ago(seconds=1))
    make_row(recipient="later", status="pending", next_attempt_at=from_now(hours=1))
    make_row(recipient="cancelled", status="cancelled")
    report = Dispatcher(engine, registry_of([NullProvider(Settings())]), settings).run_once()
    assert report.claimed == 1
    assert [s for (s,) in _rows(engine, "SELECT status FROM notifications ORDER BY id")] == [
        "sent",
        "pending",
        "cancelled",
    ]


def test_higher_priority_is_claimed_first(
    engine: Engine, settings: Settings, make_row: MakeRow, make_rows: MakeRows
) -> None:
    make_rows(120, recipient="bulk", priority=0, next_attempt_at=ago(hours=1))
    make_row(recipient="urgent", priority=10)
    Dispatcher(engine, registry_of([NullProvider(Settings())]), settings).run_once()
    assert _rows(engine, "SELECT status FROM notifications WHERE recipient = 'urgent'") == [
        ("sent",)
    ]


def test_providers_are_called_outside_any_transaction(
    engine: Engine, settings: Settings, httpserver: HTTPServer, set_env: SetEnv, make_row: MakeRow
) -> None:
    """While the receiver handles the request, the claim is committed and no transaction is open."""
    set_env(webhook_allow_http=True, webhook_allowed_networks=LOOPBACK)
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
    make_row(channel="webhook", recipient=httpserver.url_for("/hook"))
    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings)
    assert dispatcher.run_once().sent == 1
    dispatcher.close()
    assert seen == [("processing", 0)]


def test_server_errors_back_off_then_dead_with_the_last_error(
    engine: Engine, settings: Settings, httpserver: HTTPServer, set_env: SetEnv, make_row: MakeRow
) -> None:
    set_env(webhook_allow_http=True, webhook_allowed_networks=LOOPBACK)
    httpserver.expect_request("/hook").respond_with_data("overloaded", status=503)
    make_row(channel="webhook", recipient=httpserver.url_for("/hook"), max_attempts=3)
    # The dispatcher's clock, held still: a retry is due exactly its wait after it, however
    # long the machine takes between deciding and writing.
    decided_at = datetime.now(UTC)
    dispatcher = Dispatcher(
        engine, load_registry(get_settings()), settings, clock=lambda: decided_at
    )
    waits: list[tuple[Any, ...]] = []
    for _ in range(3):
        _rows(engine, "UPDATE notifications SET next_attempt_at = now() RETURNING id")
        dispatcher.run_once()
        waits.extend(
            _rows(
                engine,
                "SELECT extract(epoch FROM next_attempt_at - :decided_at)::float8, status,"
                " attempts, last_error FROM notifications",
                decided_at=decided_at,
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
    engine: Engine, settings: Settings, httpserver: HTTPServer, set_env: SetEnv, make_row: MakeRow
) -> None:
    set_env(webhook_allow_http=True, webhook_allowed_networks=LOOPBACK)
    answers = iter([Response("busy", status=503), Response("ok")])
    httpserver.expect_request("/hook").respond_with_handler(lambda request: next(answers))
    row_id = make_row(channel="webhook", recipient=httpserver.url_for("/hook"))
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
