"""Rows carry their producer, producers cancel only their own, and dedupe keys are bounded.

``notifications.producer`` (migration 0020) is the login's ``notifier.producer`` role setting
or else its name; a producer cannot write or cancel under another name. ``dedupe_key`` is at
most 1,000 bytes, refused by ``notifier.enqueue`` first and by the table's CHECK for plain SQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from notifier import client
from notifier.db import producers
from notifier.models import DEDUPE_KEY_BYTES
from tests.commands import run
from tests.console_server import Console, console_env
from tests.migrations import migrate
from tests.roles import Logins

Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def logins(engine: Engine, database_url: str) -> Iterator[Logins]:
    made = Logins(engine, database_url)
    yield made
    made.drop()


def _row(engine: Engine, row_id: int) -> tuple[object, ...]:
    with engine.begin() as conn:
        return tuple(
            conn.execute(
                text("SELECT producer, status FROM notifications WHERE id = :id"), {"id": row_id}
            ).one()
        )


def test_a_row_carries_the_login_or_the_name_its_administrator_gave_it(
    engine: Engine, logins: Logins
) -> None:
    user = logins.make("notifier_producer")
    with logins.connect(user) as conn:
        plain = client.enqueue(conn, channel="null", to="x").id
        conn.commit()
    with engine.begin() as conn:
        conn.execute(text(f"ALTER ROLE {user} SET notifier.producer = 'billing'"))
    with logins.connect(user) as conn:
        named = client.enqueue(conn, channel="null", to="x").id
        # saying the same name again is no forgery
        conn.execute("SET notifier.producer = 'billing'")
        same = client.enqueue(conn, channel="null", to="x").id
        conn.commit()
        # but the login's name is not its name any more, once its administrator gave it one
        conn.execute("SET notifier.producer = ''")
        with pytest.raises(psycopg.Error, match='producer is not "billing", this login'):
            client.enqueue(conn, channel="null", to="x")
    admin = producers.enqueue_row
    with engine.begin() as conn:
        mine = admin(conn, {**_values(), "dedupe_key": None})[0]
    assert [_row(engine, i)[0] for i in (plain, named, same, mine)] == [
        user,
        "billing",
        "billing",
        "postgres",
    ]


def _values() -> dict[str, object]:
    return {
        "channel": "null",
        "recipient": "x",
        "subject": None,
        "body": None,
        "payload": "{}",
        "dedupe_key": None,
        "max_attempts": 5,
        "priority": 0,
        "send_at": None,
        "expires_at": None,
        "guard": None,
        "template": None,
        "locale": None,
        "profile": None,
    }


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        (
            "SET notifier.producer = 'shipping';"
            " INSERT INTO notifications (channel, recipient) VALUES ('null', 'x')",
            'notifier.producer is "shipping", but this login writes as',
        ),
        (
            "INSERT INTO notifications (channel, recipient, producer)"
            " VALUES ('null', 'x', 'shipping')",
            "permission denied for table notifications",
        ),
        ("UPDATE notifications SET producer = 'shipping'", "permission denied"),
        ("ALTER ROLE CURRENT_USER SET notifier.producer = 'shipping'", "permission denied"),
        (
            # a line break in the name stays in one line of the error
            "SET notifier.producer = E'a\\nb';"
            " INSERT INTO notifications (channel, recipient) VALUES ('null', 'x')",
            r'notifier.producer is "a\\nb", but',
        ),
    ],
)
def test_a_producer_cannot_write_under_another_name(
    engine: Engine, logins: Logins, statement: str, error: str
) -> None:
    user = logins.make("notifier_producer")
    with logins.connect(user) as conn, pytest.raises(psycopg.Error, match=error) as refused:
        conn.execute(statement)
    assert "\n" not in (refused.value.diag.message_primary or "")
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM notifications")).scalar_one() == 0


def test_a_producer_s_own_operators_do_not_decide_its_name(engine: Engine, logins: Logins) -> None:
    user = logins.make("notifier_producer", schema=True)
    with engine.begin() as conn:
        conn.execute(text(f"ALTER ROLE {user} SET notifier.producer = 'billing'"))
    with logins.connect(user) as conn:  # every text equals every other
        conn.execute(
            f"CREATE FUNCTION {user}.same(a text, b text) RETURNS boolean LANGUAGE sql"
            f" AS 'SELECT true'; CREATE OPERATOR {user}.= (LEFTARG = text, RIGHTARG = text,"
            f" FUNCTION = {user}.same)"
        )
        conn.commit()

    def enqueue_as_login_name() -> None:
        with logins.connect(user, search_path=f"{user},pg_catalog,public") as conn:
            conn.execute("SET notifier.producer = ''")
            client.enqueue(conn, channel="null", to="x")
            conn.commit()

    with pytest.raises(psycopg.Error, match='producer is not "billing"'):
        enqueue_as_login_name()
    # the same check without its pinned search_path is fooled
    with engine.begin() as conn:
        conn.execute(text("ALTER FUNCTION notifier_producer_named() RESET search_path"))
    enqueue_as_login_name()
    with engine.begin() as conn:
        assert conn.execute(text("SELECT producer FROM notifications")).scalar_one() == user


def test_a_producer_cancels_its_own_rows_and_the_unowned_but_no_one_elses(
    engine: Engine, logins: Logins
) -> None:
    billing, shipping = logins.make("notifier_producer"), logins.make("notifier_producer")
    with logins.connect(shipping) as conn:
        theirs = client.enqueue(conn, channel="null", to="x", key="shipping:1").id
        theirs_too = client.enqueue(conn, channel="null", to="x").id
        conn.commit()
    with engine.begin() as conn:  # a row as written before 0020
        legacy = conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, dedupe_key, producer)"
                " VALUES ('null', 'x', 'old:1', NULL) RETURNING id"
            )
        ).scalar_one()
    with logins.connect(billing) as conn:
        mine = client.enqueue(conn, channel="null", to="x", key="billing:1").id
        assert not client.cancel(conn, "shipping:1")
        assert not producers.cancel_by_id(conn, theirs_too, "mine now")
        assert conn.execute("UPDATE notifications SET status = 'cancelled'").rowcount == 2
        conn.commit()
        # saying it is the other producer does not help
        conn.execute(f"SET notifier.producer = '{shipping}'")
        with pytest.raises(psycopg.Error, match="but this login writes as"):
            client.cancel(conn, "shipping:1")
    assert _row(engine, theirs) == (shipping, "pending")
    assert _row(engine, theirs_too) == (shipping, "pending")
    assert _row(engine, mine) == (billing, "cancelled")
    assert _row(engine, legacy) == (None, "cancelled")
    with logins.connect(shipping) as conn:
        assert client.cancel(conn, "shipping:1")
        conn.commit()
    assert _row(engine, theirs) == (shipping, "cancelled")


def test_a_dedupe_key_over_the_bound_is_refused_by_name(engine: Engine) -> None:
    with (
        pytest.raises(IntegrityError, match="notifications_dedupe_key_length"),
        engine.begin() as c,
    ):
        c.execute(
            text(
                "INSERT INTO notifications (channel, recipient, dedupe_key)"
                " VALUES ('null', 'x', :k)"
            ),
            {"k": "k" * 1_000_000},
        )
    with engine.begin() as conn:
        with pytest.raises(
            ValueError, match=r"^dedupe key is 1001 bytes; at most 1000 allowed"
        ) as refused:
            client.enqueue(conn, channel="null", to="x", key="é" * 500 + "k")
        assert "\n" not in str(refused.value)
        assert client.enqueue(conn, channel="null", to="x", key="é" * 500).created


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(key=st.text(min_size=900, max_size=1100) | st.text(max_size=20))
def test_any_key_is_either_enqueued_or_refused_in_one_line(engine: Engine, key: str) -> None:
    refused = len(key.encode("utf-8")) > DEDUPE_KEY_BYTES or "\x00" in key
    with engine.connect() as conn:
        if refused:
            with pytest.raises(ValueError, match=r"\Adedupe[ _]key [^\n]+\Z"):
                client.enqueue(conn, channel="null", to="x", key=key)
        else:
            assert client.enqueue(conn, channel="null", to="x", key=key).created
        conn.rollback()


def test_the_migration_leaves_old_rows_unowned_and_stops_on_a_key_too_long(
    engine: Engine,
) -> None:
    migrate(engine, "0019")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, dedupe_key)"
                " VALUES ('null', 'x', 'old'), ('null', 'y', repeat('k', 1500))"
            )
        )
    with pytest.raises(Exception, match=r"1 notifications have a dedupe_key over 1000 bytes"):
        migrate(engine, "head")
    with engine.begin() as conn:
        conn.execute(text("UPDATE notifications SET dedupe_key = NULL WHERE recipient = 'y'"))
    migrate(engine, "head")
    with engine.begin() as conn:
        producers_of = conn.execute(text("SELECT producer FROM notifications")).scalars().all()
    assert producers_of == [None, None]


def test_show_and_the_console_name_the_producer(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    restore_logging: None,
) -> None:
    with engine.begin() as conn:
        row_id = conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, producer)"
                " VALUES ('null', 'x', '<b>billing</b>') RETURNING id"
            )
        ).scalar_one()
    status, out, _ = run(capsys, "show", str(row_id))
    assert status == 0
    assert "<b>billing</b>" in out
    console = Console(console_env(database_url), tmp_path / "console.log").start()
    try:
        c = console.client()
        c.login("bob")
        page = c.request("GET", f"/notifications/{row_id}").text
    finally:
        console.stop()
    assert "<th>producer</th><td>&lt;b&gt;billing&lt;/b&gt;</td>" in page
