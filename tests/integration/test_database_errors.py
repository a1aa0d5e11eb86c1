"""A database that cannot be reached, refuses the login or does not exist: every command that
touches it says so in one line naming NOTIFIER_DATABASE_URL and the fix, with exit status 4
(5 for a missing database), never a traceback and never the URL's password.

Each failure is a real one: a host name that does not resolve, a port nobody listens on, a
socket that accepts and never answers, TLS asked of a server without it, a role that may not
log in, and a wrong password and none at all on a cluster of the test's own (the machine's
PostgreSQL trusts every TCP login, whatever the password).
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from notifier import db
from tests.commands import run
from tests.conftest import POSTGRES
from tests.factories import SetEnv
from tests.postgres_server import PostgresServer
from tests.raw_server import Behaviour, RawServer

pytestmark = pytest.mark.usefixtures("restore_logging")

#: In every URL: it must never be shown.
PASSWORD = "pw-never-shown-7c1e"
LOCAL = make_url(POSTGRES)
SHARED = f"{LOCAL.host}:{LOCAL.port or 5432}"
FIX_LOGIN = "correct the user and password, or let the role log in (ALTER ROLE ... LOGIN)"

#: Each command that reads or writes the database, as an operator types it.
COMMANDS = [
    ["stats"],
    ["show", "1"],
    ["send", "--channel", "null", "--to", "x", "--body", "hi"],
    ["cancel", "k1"],
    ["requeue", "--all"],
    ["purge"],
    ["migrate"],
    ["campaign", "status", "spring"],
    ["campaign", "pause", "spring"],
    ["template", "list"],
    ["suppress", "list"],
    ["health"],
]


def _free_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _never_answer(_: socket.socket, stopping: threading.Event) -> None:
    stopping.wait(30)


@pytest.fixture(scope="module")
def silent_server() -> Iterator[RawServer]:
    """Accepts connections and never answers them (the next ones wait in its backlog)."""
    server = RawServer(_never_answer)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def nologin_role() -> Iterator[str]:
    """A role on the machine's PostgreSQL that exists but may not log in."""
    name = f"notifier_nologin_{uuid.uuid4().hex[:8]}"
    admin = create_engine(f"{POSTGRES}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE ROLE {name} NOLOGIN"))
    yield name
    with admin.connect() as conn:
        conn.execute(text(f"DROP ROLE IF EXISTS {name}"))
    admin.dispose()


@pytest.fixture(scope="module")
def password_cluster() -> Iterator[PostgresServer]:
    """A cluster of this module's own whose TCP logins need the password ``right``."""
    try:
        server = PostgresServer(password="right").start()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start a PostgreSQL cluster of the test's own: {exc}")
    yield server
    server.close()


Failure = Callable[[pytest.FixtureRequest], tuple[str, str, int]]


def _unresolvable(_: pytest.FixtureRequest) -> tuple[str, str, int]:
    return (
        f"postgresql+psycopg://postgres:{PASSWORD}@db.invalid:5432/notifier",
        "cannot reach PostgreSQL: the host 'db.invalid' does not resolve (NOTIFIER_DATABASE_URL):"
        " correct the host name, or check this machine's DNS",
        4,
    )


def _refused(_: pytest.FixtureRequest) -> tuple[str, str, int]:
    port = _free_port()
    return (
        f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:{port}/notifier",
        f"cannot reach PostgreSQL at 127.0.0.1:{port} (NOTIFIER_DATABASE_URL): Connection"
        " refused: check that PostgreSQL runs there, and the host and port",
        4,
    )


def _timeout(request: pytest.FixtureRequest) -> tuple[str, str, int]:
    server: RawServer = request.getfixturevalue("silent_server")
    where = server.url.removeprefix("http://")
    return (
        f"postgresql+psycopg://postgres:{PASSWORD}@{where}/notifier?connect_timeout=1",
        f"cannot reach PostgreSQL at {where} (NOTIFIER_DATABASE_URL): no answer within 1s"
        " (connect_timeout): check the host and port, and that a firewall lets the connection"
        " through",
        4,
    )


def _missing(_: pytest.FixtureRequest) -> tuple[str, str, int]:
    return (
        f"postgresql+psycopg://postgres:{PASSWORD}@{SHARED}/notifier_not_here",
        f"database 'notifier_not_here' does not exist on {SHARED} (NOTIFIER_DATABASE_URL):"
        " correct the name, or create it with `notifier migrate`",
        5,
    )


def _tls_required(_: pytest.FixtureRequest) -> tuple[str, str, int]:
    return (
        f"postgresql+psycopg://postgres:{PASSWORD}@{SHARED}/postgres?sslmode=require",
        f"PostgreSQL at {SHARED} does not offer TLS, which NOTIFIER_DATABASE_URL requires"
        " (sslmode): server does not support SSL, but SSL was required: enable ssl on the"
        " server, or lower sslmode",
        4,
    )


def _nologin(request: pytest.FixtureRequest) -> tuple[str, str, int]:
    role = request.getfixturevalue("nologin_role")
    return (
        f"postgresql+psycopg://{role}:{PASSWORD}@{SHARED}/postgres",
        f"PostgreSQL at {SHARED} refused user {role!r} (NOTIFIER_DATABASE_URL): role"
        f' "{role}" is not permitted to log in: {FIX_LOGIN}',
        4,
    )


def _wrong_password(request: pytest.FixtureRequest) -> tuple[str, str, int]:
    cluster: PostgresServer = request.getfixturevalue("password_cluster")
    return (
        f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:{cluster.port}/postgres",
        f"PostgreSQL at 127.0.0.1:{cluster.port} refused user 'postgres'"
        ' (NOTIFIER_DATABASE_URL): password authentication failed for user "postgres":'
        f" {FIX_LOGIN}",
        4,
    )


def _no_password(request: pytest.FixtureRequest) -> tuple[str, str, int]:
    cluster: PostgresServer = request.getfixturevalue("password_cluster")
    return (
        f"postgresql+psycopg://postgres@127.0.0.1:{cluster.port}/postgres",
        f"PostgreSQL at 127.0.0.1:{cluster.port} asks user 'postgres' for a password and"
        " NOTIFIER_DATABASE_URL gives none: add it (postgresql://USER:PASSWORD@HOST/DB), or a"
        " ~/.pgpass entry",
        4,
    )


FAILURES: dict[str, Failure] = {
    "unresolvable host": _unresolvable,
    "refused port": _refused,
    "timeout": _timeout,
    "missing database": _missing,
    "TLS required": _tls_required,
    "role without LOGIN": _nologin,
    "wrong password": _wrong_password,
    "no password": _no_password,
}


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("failure", FAILURES)
def test_each_database_failure_is_one_line_and_its_exit_status(
    failure: str,
    command: list[str],
    request: pytest.FixtureRequest,
    set_env: SetEnv,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if (failure, command[0]) == ("missing database", "migrate"):
        pytest.skip("migrate creates a missing database: that is its job")
    url, line, status = FAILURES[failure](request)
    set_env(database_url=url)
    db.dispose_engine()
    try:
        code, out, err = run(capsys, *command)
    finally:
        db.dispose_engine()
    assert PASSWORD not in out + err
    if command == ["health"]:  # a healthcheck's statuses: 0 healthy, 1 not
        assert code == 1
        assert f"FAIL  database  {line}\n" in out
        assert err == ""
        return
    assert (code, out, err) == (status, "", f"notifier: {line}\n")


def test_the_timeout_is_the_urls_connect_timeout(
    raw_server: Callable[[Behaviour], RawServer],
    set_env: SetEnv,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``connect_timeout`` in the URL is the one used, not the engine's default of 10s, and the
    connection did reach the server that never answers."""
    server = raw_server(_never_answer)
    where = server.url.removeprefix("http://")
    set_env(database_url=f"postgresql+psycopg://postgres@{where}/notifier?connect_timeout=2")
    db.dispose_engine()
    started = time.monotonic()
    try:
        code, _, err = run(capsys, "stats")
    finally:
        db.dispose_engine()
    assert (code, server.accepted) == (4, 1)
    assert "no answer within 2s (connect_timeout)" in err
    assert time.monotonic() - started < 6
