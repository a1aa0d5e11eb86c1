"""The database roles of migration 0010: each part can do its work and nothing more.

Each test logs in as a LOGIN user of its own, a member of one group role, as a deployment
would (docs/roles.sql). Roles belong to the whole cluster, so the users' names are unique per
test and they are dropped afterwards.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from notifier import client, db, ops
from notifier.campaigns import Campaigns
from notifier.db import rescue
from notifier.db.migrate import alembic_dir
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import registry_of
from notifier.providers.null import NullProvider
from notifier.settings import Settings
from tests.factories import SetEnv
from tests.migrations import migrate
from tests.roles import Logins

GROUPS = (
    "notifier_producer",
    "notifier_worker",
    "notifier_operator",
    "notifier_audience",
    "notifier_api",
)
REFUSED = "grant notifier_audience SELECT on the tables your audience query reads"


@pytest.fixture
def login(engine: Engine, database_url: str) -> Iterator[Callable[[str], str]]:
    """Makes a LOGIN user in a group role; returns the database URL that logs in as it."""
    made = Logins(engine, database_url)
    yield lambda group: made.url(made.make(group))
    made.drop()


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _one(engine: Engine, sql: str, **params: object) -> object:
    with engine.begin() as conn:
        return conn.execute(text(sql), params).scalar()


def test_a_producer_enqueues_and_cancels_and_does_nothing_else(
    engine: Engine, login: Callable[[str], str]
) -> None:
    with psycopg.connect(_dsn(login("notifier_producer"))) as conn:
        first = client.enqueue(conn, channel="email", to="ann@example.com", body="hi", key="k")
        again = client.enqueue(conn, channel="email", to="ann@example.com", body="hi", key="k")
        other = client.enqueue(conn, channel="email", to="bob@example.com", body="hi")
        conn.commit()
        assert (again.id, again.created) == (first.id, False)
        assert client.cancel(conn, "k", "user confirmed")
        conn.commit()
        refusals = {
            "UPDATE notifications SET status = 'sent', sent_at = now()": "permission denied",
            "UPDATE notifications SET status = 'dead', last_error = 'x'": "row-level security",
            "DELETE FROM notifications": "permission denied",
            "SELECT count(*) FROM notification_attempts": "permission denied",
            "SELECT recipient FROM notifications": "permission denied",
            "INSERT INTO notifications (channel, recipient, status) VALUES ('n', 'x', 'sent')": (
                "permission denied"
            ),
        }
        for statement, error in refusals.items():
            with pytest.raises(psycopg.Error, match=error):
                conn.execute(statement)
            conn.rollback()
        # A finished row is out of a producer's reach: not even re-cancelled.
        assert conn.execute("UPDATE notifications SET status = 'cancelled'").rowcount == 1
    assert _one(engine, f"SELECT status FROM notifications WHERE id = {first.id}") == "cancelled"
    assert _one(engine, f"SELECT status FROM notifications WHERE id = {other.id}") == "cancelled"


def test_a_worker_dispatches_rescues_and_purges_but_writes_no_rows(
    engine: Engine, settings: Settings, login: Callable[[str], str]
) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient)"
                " SELECT 'null', 'x' FROM generate_series(1, 20)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status, attempts, claim_token,"
                " claimed_by, locked_until) VALUES ('null', 'lost', 'processing', 1,"
                " gen_random_uuid(), 'gone:1', now() - interval '1 minute')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status, sent_at, updated_at)"
                " VALUES ('null', 'old', 'sent', now() - interval '90 days',"
                " now() - interval '90 days')"
            )
        )
    worker = db.make_engine(login("notifier_worker"))
    try:
        dispatcher = Dispatcher(worker, registry_of([NullProvider(Settings())]), settings)
        assert dispatcher.run_once().sent == 20
        dispatcher.close()
        with worker.begin() as conn:
            assert rescue.rescue_expired(conn) == {"pending": 1, "dead": 0}
        assert ops.purge(worker, settings).deleted["sent"] == 1
        for statement in (
            "INSERT INTO notifications (channel, recipient) VALUES ('null', 'x')",
            "DELETE FROM campaigns",
            "INSERT INTO templates (name, channel, locale, body) VALUES ('t', 'null', 'en', 'x')",
            "CREATE TABLE mine (id int)",
        ):
            with pytest.raises(Exception, match="permission denied"), worker.begin() as conn:
                conn.execute(text(statement))
    finally:
        worker.dispose()
    assert _one(engine, "SELECT count(*) FROM notification_attempts WHERE outcome = 'sent'") == 20


def test_a_worker_marks_a_campaign_finished_and_changes_nothing_else_of_it(
    engine: Engine, settings: Settings, login: Callable[[str], str]
) -> None:
    campaigns = Campaigns(engine)
    campaigns.create("spring", "null", body="hi")
    campaigns.import_audience(
        "spring", io.StringIO("email\na@example.com\nb@example.com\n"), "email"
    )
    campaigns.launch("spring")
    worker = db.make_engine(login("notifier_worker"))
    try:
        dispatcher = Dispatcher(worker, registry_of([NullProvider(Settings())]), settings)
        assert dispatcher.run_once().sent == 2
        dispatcher.close()
        assert Campaigns(worker).finish() == ["spring"]
        with pytest.raises(Exception, match="permission denied"), worker.begin() as conn:
            conn.execute(text("UPDATE campaigns SET body = 'changed'"))
    finally:
        worker.dispose()
    assert _one(engine, "SELECT status || ' ' || body FROM campaigns") == "finished hi"


def test_an_operator_requeues_purges_and_runs_a_campaign(
    engine: Engine, settings: Settings, login: Callable[[str], str]
) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status, attempts, last_error,"
                " updated_at, sent_at) VALUES"
                " ('null', 'dead', 'dead', 5, 'boom', now(), NULL),"
                " ('null', 'old', 'sent', 1, NULL, now() - interval '90 days', now())"
            )
        )
        conn.execute(text("CREATE TABLE users (email text, name text)"))
        conn.execute(
            text("INSERT INTO users VALUES ('a@example.com', 'A'), ('b@example.com', 'B')")
        )
        conn.execute(text("GRANT SELECT ON users TO notifier_audience"))
    operator = db.make_engine(login("notifier_operator"))
    try:
        count, snap = ops.count_requeue(operator, ops.DeadFilter())
        assert count == 1
        assert ops.requeue(operator, ops.DeadFilter(), snap).changed == 1
        assert ops.purge(operator, settings).deleted["sent"] == 1
        campaigns = Campaigns(operator)
        campaigns.create("spring", "null", subject="Hi {name}")
        query = "SELECT email AS recipient, name FROM users"
        assert campaigns.audience_from_query("spring", query) == 2
        assert campaigns.launch("spring") == 2
    finally:
        operator.dispose()
    assert _one(engine, "SELECT status FROM notifications WHERE recipient = 'dead'") == "pending"
    assert _one(engine, "SELECT subject FROM notifications WHERE recipient = 'b@example.com'") == (
        "Hi B"
    )


def test_the_audience_role_holds_nothing_by_default(engine: Engine) -> None:
    held = _one(
        engine,
        "SELECT array_agg(t.tablename || ' ' || p.privilege) FROM pg_tables AS t"
        " CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p(privilege)"
        " WHERE t.schemaname = 'public'"
        "   AND has_table_privilege('notifier_audience', t.tablename, p.privilege)",
    )
    assert held is None
    assert not _one(engine, "SELECT has_schema_privilege('notifier_audience', 'public', 'CREATE')")
    memberships = _one(
        engine,
        "SELECT count(*) FROM pg_auth_members WHERE member = 'notifier_audience'::regrole",
    )
    assert memberships == 0


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("SELECT pg_read_file('/etc/passwd') AS recipient", REFUSED),
        ("SELECT d AS recipient FROM pg_ls_dir('/') AS d", REFUSED),
        ("SELECT recipient FROM notifications", REFUSED),
        (
            # The session's own user could take back any role: not from inside the query.
            "SELECT set_config('role', 'postgres', true) AS recipient,"
            " query_to_xml('SELECT pg_read_file(''/etc/passwd'')', true, true, '') AS x",
            REFUSED,
        ),
        ("SELECT nextval('notifications_id_seq')::text AS recipient", REFUSED),
        (
            "WITH gone AS (DELETE FROM users RETURNING email) SELECT email AS recipient FROM gone",
            "may only read",
        ),
        ("COPY users FROM PROGRAM 'id'", "the audience query failed: syntax error"),
        ("SELECT 1 AS recipient) AS q; DROP TABLE users; --", "the audience query failed"),
        ("SELECT email FROM users", "must return a column named recipient"),
    ],
)
def test_an_audience_query_reads_only_what_was_granted_to_it(
    engine: Engine, query: str, error: str
) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE users (email text, name text)"))
        conn.execute(text("INSERT INTO users VALUES ('a@example.com', 'A')"))
        conn.execute(text("GRANT SELECT ON users TO notifier_audience"))
    campaigns = Campaigns(engine)
    campaigns.create("c", "null", body="hi")
    with pytest.raises(ValueError, match=error) as refused:
        campaigns.audience_from_query("c", query)
    assert "\n" not in str(refused.value)
    assert _one(engine, "SELECT count(*) FROM users") == 1
    assert campaigns.audience_from_query("c", "SELECT email AS recipient FROM users") == 1


def test_nothing_an_audience_query_does_outlives_it(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE users (email text)"))
        conn.execute(text("INSERT INTO users VALUES ('a@example.com')"))
        conn.execute(text("GRANT SELECT ON users TO notifier_audience"))
    campaigns = Campaigns(engine)
    campaigns.create("c", "null", body="hi")
    query = (
        "SELECT email AS recipient, pg_advisory_lock(42) AS locked,"
        " set_config('search_path', 'nowhere', false) AS path FROM users"
    )
    assert campaigns.audience_from_query("c", query) == 1
    held = _one(
        engine,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 42"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    assert held == 0


def test_an_audience_query_that_runs_too_long_is_stopped(engine: Engine, set_env: SetEnv) -> None:
    set_env(audience_query_timeout=0.2)
    campaigns = Campaigns(engine)
    campaigns.create("c", "null", body="hi")
    with pytest.raises(ValueError, match=r"ran longer than 0.2s and was stopped"):
        campaigns.audience_from_query("c", "SELECT 'a' AS recipient FROM pg_sleep(5)")


def test_the_downgrade_revokes_the_grants_and_keeps_the_roles(engine: Engine) -> None:
    config = Config()
    config.set_main_option("script_location", str(alembic_dir()))
    config.attributes["configure_logging"] = False
    command.downgrade(config, "0009")  # on NOTIFIER_DATABASE_URL, this test's database
    roles = {"roles": list(GROUPS)}
    granted = (
        "SELECT count(*) FROM information_schema.role_table_grants WHERE grantee = ANY(:roles)"
    )
    assert _one(engine, granted, **roles) == 0
    assert _one(engine, "SELECT count(*) FROM pg_roles WHERE rolname = ANY(:roles)", **roles) == 5
    command.upgrade(config, "head")
    assert _one(engine, granted, **roles) != 0


def test_the_documented_script_makes_working_logins(engine: Engine) -> None:
    script = (Path(__file__).resolve().parents[2] / "docs" / "roles.sql").read_text()
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE users (email text)"))
        conn.execute(text(script))
        members = conn.execute(
            text(
                "SELECT pg_has_role('billing_service', 'notifier_producer', 'MEMBER'),"
                " pg_has_role('notifier_worker_login', 'notifier_worker', 'MEMBER'),"
                " pg_has_role('ops_alice', 'notifier_audience', 'MEMBER'),"
                " pg_has_role('notifier_api_login', 'notifier_api', 'MEMBER'),"
                " has_table_privilege('notifier_audience', 'users', 'SELECT')"
            )
        ).one()
        conn.rollback()  # the logins belong to the cluster: leave none behind
    assert tuple(members) == (True, True, True, True, True)


def test_notifier_migrate_grants_the_api_its_temporary_tables_again(engine: Engine) -> None:
    """A database restored from a dump, or copied as a template, has lost its own grants: the
    next ``notifier migrate``, with nothing left to upgrade, makes them again."""
    with engine.connect() as conn:
        database = conn.execute(text("SELECT current_database()")).scalar_one()
    hardened = f'TEMPORARY ON DATABASE "{database}"'
    may = text("SELECT has_database_privilege('notifier_api', current_database(), 'TEMPORARY')")
    try:
        with engine.begin() as conn:
            conn.execute(text(f"REVOKE {hardened} FROM PUBLIC, notifier_api"))
        with engine.connect() as conn:
            assert conn.execute(may).scalar_one() is False  # the grant is gone for real
        migrate(engine, "head")
        with engine.connect() as conn:
            assert conn.execute(may).scalar_one() is True
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"GRANT {hardened} TO PUBLIC"))
