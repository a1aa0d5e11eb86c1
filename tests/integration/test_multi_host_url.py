"""A ``NOTIFIER_DATABASE_URL`` naming a primary and its standby (``?host=h1:p1&host=h2:p2
&target_session_attrs=read-write``): every connection notifier makes takes the primary, the
standby listed first included, and every command reads the URL.

The engine, the heartbeat's connection and the ``LISTEN`` connection each ask the server they
reached whether it is in recovery and which port it listens on. The pair is a cluster of the
test's own and a streaming standby of it (``tests.postgres_server``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pydantic
import pytest
from sqlalchemy import text

from notifier import db
from notifier.db import wakeups, workers
from notifier.db.migrate import migrate
from notifier.settings import Settings, get_settings
from notifier.worker.heartbeat import Heartbeat
from tests.commands import run
from tests.factories import SetEnv
from tests.postgres_server import PostgresServer, _free_port

pytestmark = pytest.mark.usefixtures("restore_logging")

WHERE = "SELECT pg_is_in_recovery(), inet_server_port()"


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A primary, migrated, and its asynchronous standby."""
    try:
        primary = PostgresServer().start()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start a PostgreSQL cluster of the test's own: {exc}")
    try:
        standby = primary.standby()
        try:
            yield primary, standby
        finally:
            standby.close()
    finally:
        primary.close()


def _url(*ports: int, database: str = "notifier") -> str:
    hosts = "&".join(f"host=127.0.0.1:{port}" for port in ports)
    return f"postgresql://postgres@/{database}?{hosts}&target_session_attrs=read-write"


def test_every_connection_takes_the_primary_past_the_standby_listed_first(
    pair: tuple[PostgresServer, PostgresServer], set_env: SetEnv
) -> None:
    primary, standby = pair
    assert (primary.in_recovery(), standby.in_recovery()) == (False, True)
    set_env(database_url=_url(standby.port, primary.port))
    url = get_settings().database_url
    assert url.startswith("postgresql+psycopg://postgres@/notifier?host=127.0.0.1:")

    # migrate connects to the database "postgres" first, to create "notifier": on the primary
    said: list[str] = []
    migrate(url, say=said.append)
    assert said == ["created database notifier", "database notifier is at the newest schema"]

    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            assert tuple(conn.execute(text(WHERE)).one()) == (False, primary.port)
    finally:
        engine.dispose()
    with workers.connect(url) as beat, wakeups.listen(url) as listener:
        for own in (beat, listener):
            assert own.execute(WHERE).fetchone() == (False, primary.port)
    heartbeat = Heartbeat(url, "host:1:multi", 5)
    assert heartbeat.beat()
    heartbeat.stop()

    # what the primary wrote reached the standby, which still refuses writes
    deadline = time.monotonic() + 30
    while standby.execute("SELECT 1 FROM pg_database WHERE datname = 'notifier'") != [(1,)]:
        assert time.monotonic() < deadline, "the standby never replayed CREATE DATABASE"
        time.sleep(0.1)


def test_commands_read_a_multi_host_url_and_say_when_no_host_takes_writes(
    pair: tuple[PostgresServer, PostgresServer],
    set_env: SetEnv,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    primary, standby = pair
    set_env(database_url=_url(standby.port, primary.port))
    db.dispose_engine(close=True)
    try:
        assert run(capsys, "migrate")[0] == 0
        code, out, _ = run(capsys, "health")
        assert code == 0, out
        assert out.startswith("ok  database  ")

        dead = _free_port()
        set_env(database_url=_url(standby.port, dead))
        db.dispose_engine(close=True)
        code, out, err = run(capsys, "stats")
    finally:
        db.dispose_engine(close=True)
    s, d = f"127.0.0.1:{standby.port}", f"127.0.0.1:{dead}"
    assert (code, out) == (4, "")
    assert err == (
        f"notifier: no PostgreSQL at {s}, {d} takes writes (NOTIFIER_DATABASE_URL,"
        f" target_session_attrs): {s}: session is read-only; {d}: Connection refused: a standby"
        " answered where the primary is needed: wait for a standby to be promoted, or name the"
        " primary's host\n"
    )


def test_libpqs_comma_form_is_refused_with_the_form_that_works() -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        Settings(database_url="postgresql://postgres@h1:5432,h2:5433/notifier")
    assert "several hosts go in the query: postgresql://USER@/DB?host=H1:P1&host=H2:P2" in str(
        refused.value
    )
    # a comma in the password is not a second host
    assert Settings(database_url="postgresql://u:a,b@h1:5432/n").database_url == (
        "postgresql+psycopg://u:a,b@h1:5432/n"
    )
