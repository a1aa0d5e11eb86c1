"""The producers' helper, inside the caller's own transaction, on both kinds of connection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import Engine, text

import notifier
from notifier.db.templates import upsert_template


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM notifications")).scalar_one())


def test_written_only_if_the_callers_transaction_commits(engine: Engine) -> None:
    with engine.connect() as conn:
        trans = conn.begin()
        notifier.enqueue(conn, channel="email", to="a@example.com", subject="hi")
        trans.rollback()
    assert _count(engine) == 0
    with engine.begin() as conn:
        result = notifier.enqueue(conn, channel="email", to="a@example.com", subject="hi")
    assert result.created
    assert _count(engine) == 1


def test_same_key_is_one_row_and_says_so(engine: Engine) -> None:
    with engine.begin() as conn:
        first = notifier.enqueue(conn, channel="null", to="x", key="signup:42")
        second = notifier.enqueue(conn, channel="null", to="x", key="signup:42")
    assert first.created
    assert not second.created
    assert second.id == first.id
    assert _count(engine) == 1


def test_psycopg_connection_and_delayed_send(engine: Engine, database_url: str) -> None:
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        result = notifier.enqueue(
            conn, channel="null", to="x", key="k", delay=timedelta(hours=24), payload={"a": 1}
        )
        assert notifier.enqueue(conn, channel="null", to="x", key="k").id == result.id
    with engine.connect() as conn:
        wait, payload = conn.execute(
            text("SELECT next_attempt_at - now(), payload FROM notifications")
        ).one()
    assert timedelta(hours=23, minutes=59) < wait <= timedelta(hours=24)
    assert payload == {"a": 1}


def test_cancel_by_key_only_touches_pending_rows(engine: Engine) -> None:
    with engine.begin() as conn:
        notifier.enqueue(conn, channel="null", to="x", key="k1")
        assert notifier.cancel(conn, "k1")
        assert not notifier.cancel(conn, "k1")
        assert not notifier.cancel(conn, "nope")
        row = conn.execute(text("SELECT status, last_error FROM notifications")).one()
    assert tuple(row) == ("cancelled", "cancelled by producer")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"send_at": datetime(2030, 1, 1), "delay": timedelta(1)}, "not both"),
        ({"send_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"max_attempts": 0}, "at least 1"),
        ({"payload": [1]}, "payload must be a mapping"),
        ({"delay": timedelta(seconds=10), "expires_at": datetime.now(UTC)}, "expire unsent"),
    ],
)
def test_bad_arguments_are_refused(engine: Engine, kwargs: dict[str, object], message: str) -> None:
    with engine.begin() as conn, pytest.raises(ValueError, match=message):
        notifier.enqueue(conn, channel="null", to="x", **kwargs)  # type: ignore[arg-type]


def test_send_at_in_the_past_is_due_now(engine: Engine) -> None:
    with engine.begin() as conn:
        notifier.enqueue(conn, channel="null", to="x", send_at=datetime(2020, 1, 1, tzinfo=UTC))
        due = conn.execute(text("SELECT next_attempt_at <= now() FROM notifications")).scalar()
    assert due


def test_a_templated_row_carries_its_template_and_locale(engine: Engine) -> None:
    with engine.begin() as conn:
        upsert_template(conn, "welcome", "email", "de", ("Hallo {{ first_name }}", "...", None))
        notifier.enqueue(
            conn,
            channel="email",
            to="ann@example.com",
            template="welcome",
            locale="de-AT",
            payload={"first_name": "Ann"},
        )
        row = conn.execute(text("SELECT template, locale, subject FROM notifications")).one()
    assert tuple(row) == ("welcome", "de-AT", None)
