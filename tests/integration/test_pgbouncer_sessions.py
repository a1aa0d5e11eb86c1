"""What a transaction pooler changes for one process's connections (docs/pgbouncer.md), against a
real PgBouncer in transaction mode (``tests.pgbouncer_server``) in front of the test's database:
a launch's session lock is held on the session URL's connection, never on a server connection
PgBouncer gives to other clients; a pooled engine's statement timeout holds though PgBouncer
refuses to carry it at login; connections of their own prepare nothing."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from notifier import db
from notifier.campaigns import Campaigns
from notifier.db.engine import own_connection
from tests.conftest import POSTGRES
from tests.pgbouncer_server import PgBouncer, binary

pytestmark = pytest.mark.skipif(
    binary() is None, reason="PgBouncer is not installed (apt-get install pgbouncer)"
)


@pytest.fixture
def pgbouncer() -> Iterator[PgBouncer]:
    upstream = make_url(POSTGRES)
    server = PgBouncer(upstream.port or 5432, upstream_host=upstream.host or "127.0.0.1")
    yield server.start()
    server.close()


@pytest.fixture
def pooled_url(pgbouncer: PgBouncer, database_url: str) -> str:
    return pgbouncer.url(make_url(database_url).database or "")


@pytest.fixture
def pooled(pooled_url: str) -> Iterator[Engine]:
    engine = db.make_engine(pooled_url, pooled=True)
    yield engine
    engine.dispose()


def _lock_holders(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    " AND classid = hashtext('notifier.launch')::oid"
                )
            ).scalars()
        )


@pytest.mark.parametrize("on_session", [False, True], ids=["through the pooler", "session URL"])
def test_a_launch_holds_its_lock_on_the_session_connection(
    on_session: bool, engine: Engine, pooled: Engine, pgbouncer: PgBouncer
) -> None:
    campaigns = Campaigns(pooled, session=engine if on_session else None)
    campaigns.create("spring", "null", body="Hello {name}")
    csv = "email,name\n" + "".join(f"u{i}@example.com,n{i}\n" for i in range(6))
    campaigns.import_audience("spring", io.StringIO(csv), "email")
    holders: list[list[int]] = []
    servers: list[set[int]] = []

    def look(_written: int) -> None:  # between chunks, while the lock is held
        holders.append(_lock_holders(engine))
        servers.append({int(s["remote_pid"]) for s in pgbouncer.show("SERVERS")})

    assert campaigns.launch("spring", look, chunk=2, parallel=1) == 6
    assert len(holders) == 3
    for held_by, pgbouncer_servers in zip(holders, servers, strict=True):
        assert len(held_by) == 1
        # Through the pooler the lock belongs to one of PgBouncer's server connections, which
        # it hands to other clients between the launch's transactions; on the session URL, to
        # a connection of the launch's own.
        assert (held_by[0] in pgbouncer_servers) is not on_session
    if on_session:
        assert _lock_holders(engine) == []


def test_a_pooled_engine_keeps_its_statement_timeout_without_login_options(
    pooled_url: str,
) -> None:
    at_login = db.make_engine(pooled_url, statement_timeout=0.5)
    try:
        with pytest.raises(OperationalError, match="unsupported startup parameter: options"):
            at_login.connect().close()
    finally:
        at_login.dispose()
    each = db.make_engine(pooled_url, statement_timeout=0.5, pooled=True)
    try:
        with each.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "500ms"
            with pytest.raises(OperationalError, match="statement timeout"):
                conn.execute(text("SELECT pg_sleep(3)"))
        with each.connect() as conn:  # and the next transaction has it again
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "500ms"
    finally:
        each.dispose()


def test_a_connection_of_its_own_prepares_nothing(pooled_url: str) -> None:
    with own_connection(pooled_url, application_name="notifier-heartbeat") as conn:
        assert conn.prepare_threshold is None
        for n in range(10):  # past psycopg's threshold of 5, through the pooler
            assert conn.execute("SELECT %s::int", [n]).fetchone() == (n,)
