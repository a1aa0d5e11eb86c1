"""Fixtures shared by every tier: a real PostgreSQL database per test, a real Redis.

The schema is migrated once per run into a template database; each test that asks for
``database_url`` gets a fresh copy (``CREATE DATABASE ... TEMPLATE``), so tests never see each
other's rows. ``NOTIFIER_TEST_POSTGRES`` points elsewhere if needed. Redis is a server of the
run's own (``tests.redis_server``), unless ``NOTIFIER_TEST_REDIS`` names one to use instead.

Rows and settings come from here too: ``make_row``/``make_rows`` write rows as a producer does,
``raw_row`` the rows no producer could write (``tests.factories``); ``make_settings(**overrides)``
builds a ``Settings`` for the test's database, and ``set_env(**settings)`` sets the environment
that ``get_settings()`` reads, undone after the test.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from hypothesis import settings as hypothesis_settings
from sqlalchemy import Engine, create_engine, text

from notifier import db
from notifier.db.migrate import grant_database, migrate
from notifier.settings import Settings
from tests.factories import MakeRow, MakeRows, MakeSettings, Rows, SetEnv, environment
from tests.raw_server import Behaviour, RawServer
from tests.redis_server import RedisServer
from tests.smtp_sink import SmtpSink

# With CI set, every property test draws the same examples on every run: a CI run is
# repeatable, and what a property finds is found on a developer's machine, not first in CI.
hypothesis_settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

POSTGRES = os.environ.get("NOTIFIER_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432")
REDIS = os.environ.get("NOTIFIER_TEST_REDIS")
# One template per test run, so runs side by side (or a CI run beside a developer's) never drop
# each other's.
TEMPLATE = f"notifier_test_template_{os.getpid()}"


def _admin() -> Engine:
    # pre-ping: a test may restart PostgreSQL between creating its database and dropping it
    return create_engine(f"{POSTGRES}/postgres", isolation_level="AUTOCOMMIT", pool_pre_ping=True)


@pytest.fixture(scope="session")
def template_database() -> Iterator[str]:
    admin = _admin()
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)"))
    migrate(f"{POSTGRES}/{TEMPLATE}")
    yield TEMPLATE
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the test session's logging back after a test that sets up the process's own (the
    commands do, as ``logs.configure``)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def set_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[SetEnv]:
    """``set_env(batch_size=10, smtp_host=None)`` sets (or, with None, removes) ``NOTIFIER_*``
    variables and drops the cached ``get_settings()``; all undone after the test."""
    with environment(monkeypatch) as set_env:
        yield set_env


@pytest.fixture
def database_url(template_database: str, set_env: SetEnv) -> Iterator[str]:
    """A freshly migrated database of its own, also set as ``NOTIFIER_DATABASE_URL``."""
    name = f"notifier_test_{uuid.uuid4().hex[:12]}"
    admin = _admin()
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {template_database}"))
        grant_database(conn, name)  # as notifier migrate does: not carried by the template
    url = f"{POSTGRES}/{name}"
    set_env(database_url=url)
    db.dispose_engine()
    yield url
    db.dispose_engine(close=True)
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = db.make_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    """This run's own Redis server (``None`` when ``NOTIFIER_TEST_REDIS`` names another)."""
    if REDIS:
        yield None
        return
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer | None, set_env: SetEnv) -> Iterator[str]:
    """A Redis database emptied for this test, also set as ``NOTIFIER_REDIS_URL``."""
    if redis_server is not None and not redis_server.alive():  # a fault test left it stopped
        redis_server.start()
    url = redis_server.url if redis_server is not None else str(REDIS)
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.flushdb()
    set_env(redis_url=url)
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def make_settings(database_url: str) -> MakeSettings:
    """``make_settings(batch_size=10)``: Settings for this test's database, fast retries and
    small batches unless overridden; the rest from the environment at the time of the call."""

    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "database_url": database_url,
            "retry_base_seconds": 1,
            "retry_max_seconds": 60,
            "batch_size": 50,
        }
        return Settings(**{**values, **overrides})  # type: ignore[arg-type]

    return make


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    """Settings for this test's database, fast retries, small batches."""
    return make_settings()


@pytest.fixture
def rows(engine: Engine) -> Rows:
    return Rows(engine)


@pytest.fixture
def make_row(rows: Rows) -> MakeRow:
    """``make_row(channel="email", status="dead", last_error="boom") -> id``: see ``Rows.make``."""
    return rows.make


@pytest.fixture
def make_rows(rows: Rows) -> MakeRows:
    """``make_rows(3, recipient=lambda i: f"u{i}") -> ids``: see ``Rows.many``."""
    return rows.many


@pytest.fixture
def raw_row(rows: Rows) -> MakeRow:
    """``raw_row(channel="null", recipient="x", payload="[1]") -> id``: see ``Rows.raw``."""
    return rows.raw


@pytest.fixture
def smtp_sink(set_env: SetEnv) -> Iterator[SmtpSink]:
    """A real SMTP server on loopback, also set as ``NOTIFIER_SMTP_HOST``/``_PORT``."""
    sink = SmtpSink().start()
    set_env(smtp_host=sink.host, smtp_port=sink.port)
    yield sink
    sink.stop()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Behaviour], RawServer]]:
    """Starts bare socket servers (see ``tests.raw_server``); stops them after the test."""
    servers: list[RawServer] = []

    def start(behave: Behaviour) -> RawServer:
        servers.append(RawServer(behave))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
