"""Fixtures shared by every tier: a real PostgreSQL database per test, a real Redis.

The schema is migrated once per run into a template database; each test that asks for
``database_url`` gets a fresh copy (``CREATE DATABASE ... TEMPLATE``), so tests never see each
other's rows. ``NOTIFIER_TEST_POSTGRES`` points elsewhere if needed. Redis is a server of the
run's own (``tests.redis_server``), unless ``NOTIFIER_TEST_REDIS`` names one to use instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from sqlalchemy import Engine, create_engine, text

from notifier import db
from notifier.db.migrate import migrate
from notifier.settings import Settings, get_settings
from tests.raw_server import Behaviour, RawServer
from tests.redis_server import RedisServer
from tests.smtp_sink import SmtpSink

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
def database_url(template_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A freshly migrated database of its own, also set as ``NOTIFIER_DATABASE_URL``."""
    name = f"notifier_test_{uuid.uuid4().hex[:12]}"
    admin = _admin()
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {template_database}"))
    url = f"{POSTGRES}/{name}"
    monkeypatch.setenv("NOTIFIER_DATABASE_URL", url)
    get_settings.cache_clear()
    db.dispose_engine()
    yield url
    db.dispose_engine(close=True)
    get_settings.cache_clear()
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
def redis_url(redis_server: RedisServer | None, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Redis database emptied for this test, also set as ``NOTIFIER_REDIS_URL``."""
    if redis_server is not None and not redis_server.alive():  # a fault test left it stopped
        redis_server.start()
    url = redis_server.url if redis_server is not None else str(REDIS)
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.flushdb()
    monkeypatch.setenv("NOTIFIER_REDIS_URL", url)
    get_settings.cache_clear()
    yield url
    client.flushdb()
    client.close()
    get_settings.cache_clear()


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Settings for this test's database, fast retries, small batches."""
    return Settings(
        database_url=database_url,
        retry_base_seconds=1,
        retry_max_seconds=60,
        batch_size=50,
    )


@pytest.fixture
def smtp_sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[SmtpSink]:
    """A real SMTP server on loopback, also set as ``NOTIFIER_SMTP_HOST``/``_PORT``."""
    sink = SmtpSink().start()
    monkeypatch.setenv("NOTIFIER_SMTP_HOST", sink.host)
    monkeypatch.setenv("NOTIFIER_SMTP_PORT", str(sink.port))
    get_settings.cache_clear()
    yield sink
    sink.stop()
    get_settings.cache_clear()


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
